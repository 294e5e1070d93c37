"""The functions that allocate and launch the FlashCUR kernels, one per kernel (pair), with the launch parameters of
:mod:`kernels.cur.launch` for the shape, dtype and GPU.

Forward: :func:`rv_forward` (kernel a), :func:`u_forward` (kernel b), :func:`out_forward` (kernel c) of
:mod:`kernels.cur.forward`; backward: :func:`rv_backward` (kernel a's gradients) and :func:`out_backward` (the
``C W`` part of kernel c) of :mod:`kernels.cur.backward`. Shapes are ``(B, H, ·, d)``; see those modules for the
equations and layouts. The kernels whose programs walk all n tokens (``_rv_fwd``, ``_rv_bwd_q``, ``_out_bwd_kw``: a
block of m rows or keys each) split n into ``S`` parts on a third grid axis and write float32 per-split partials
``(B, H, S, m, ·)``, combined here: ``_rv_fwd``'s by the log-sum-exp merge, one kernel
(:func:`kernels.cur.merge.merge_splits`), the gradients' by a sum over ``S``. Deterministic (no atomics); with ``S = 1`` the partial is the result (no extra launch). Every
function only allocates and launches, so it runs on ``meta`` tensors inside :func:`kernels.common.launch.recording`
(the launch plan). The custom ops that wrap them (fake implementations, autograd, FLOP formulas) are
:mod:`kernels.cur.ops`.
"""

from __future__ import annotations

import math

import torch
import triton

from kernels.common.rows import token_major
from kernels.cur import launch, merge


LOG2E = 1.4426950408889634


def _scale(d: int) -> float:
    return LOG2E / math.sqrt(d)


def _split(kernel: str, cfg, batch_heads: int, n: int, m: int) -> tuple[int, int]:
    """``(S, SPLIT_N)`` of a launch of ``kernel`` (one of :data:`SPLIT_KERNELS`)."""
    programs = batch_heads * (m // cfg.constexprs["BLOCK_M"])
    return launch.splits(programs, n, cfg.constexprs["BLOCK_N"], launch.TARGET_PROGRAMS)


def _partials(batch: int, heads: int, parts: int, *tail: int, like: torch.Tensor) -> torch.Tensor:
    """An empty float32 ``(B, H, S, *tail)`` for per-split partials, or ``(B, H, *tail)`` with one split (the kernels
    index both alike: partial ``[bh, s]`` at ``(bh·S + s)·prod(tail)``), so one split is the result itself."""
    return torch.empty(batch, heads, *([parts] if parts > 1 else []), *tail, device=like.device, dtype=torch.float32)


def rv_forward(q_sel: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor):
    """Kernel (a). ``q_sel`` ``(B,H,m,d)``, ``k, v`` ``(B,H,n,d)``, ``key_mask`` bool ``(B,n)``.

    Returns ``RV`` float32 ``(B,H,m,d)`` and the base-2 log-sum-exp of ``R``'s rows, float32 ``(B,H,m)``.
    """
    B, H, m, d = q_sel.shape
    n = k.shape[2]
    if not (k.shape[-1] == v.shape[-1] == d and k.shape == v.shape):  # the tiles hold d columns of each
        raise ValueError(f"kernel (a) takes k, v (B, H, n, d) with q_sel's d = {d}; got {tuple(k.shape)}, {tuple(v.shape)}")
    cfg = launch.config("_rv_fwd", n, m, d, q_sel)
    parts, split_n = _split("_rv_fwd", cfg, B * H, n, m)
    rv, lse = _partials(B, H, parts, m, d, like=q_sel), _partials(B, H, parts, m, like=q_sel)
    mask = key_mask.to(torch.uint8)
    launch.launch(
        "_rv_fwd", (B * H, m // cfg.constexprs["BLOCK_M"], parts), cfg,
        q_sel, k, v, mask, rv, lse,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), mask.stride(0),
        H, n, d, m, split_n, _scale(d),
        loop=("keys", triton.cdiv(split_n, cfg.constexprs["BLOCK_N"])),
    )
    return merge.merge_splits(rv, lse) if parts > 1 else (rv, lse)


def u_forward(q_sel: torch.Tensor, k_sel: torch.Tensor, valid_k: torch.Tensor) -> torch.Tensor:
    """Kernel (b). ``q_sel, k_sel`` ``(B,H,m,d)``, ``valid_k`` bool ``(B,H,m)`` (usable key slots)
    -> ``U = softmax(s·Q_I K_Jᵀ)`` over the valid slots, float32 ``(B,H,m,m)``."""
    B, H, m, d = q_sel.shape
    cfg = launch.config("_u_fwd", m, m, d, q_sel)
    u = torch.empty(B, H, m, m, device=q_sel.device, dtype=torch.float32)
    launch.launch("_u_fwd", (B * H, m // cfg.constexprs["BLOCK_M"]), cfg, q_sel, k_sel, valid_k.to(torch.uint8), u, d, _scale(d),
           loop=("none", 1))
    return u


def out_forward(q, k_sel, valid_k, w, rv, slot):
    """Kernel (c). ``q`` ``(B,H,n,d)``, ``k_sel`` ``(B,H,m,d)``, ``valid_k`` bool ``(B,H,m)`` (the
    columns of ``C`` to keep), ``w, rv`` float32 ``(B,H,m,d)``,
    ``slot`` int32 ``(B,H,n)`` (position of each row in ``I``, −1 if not selected).

    Returns ``Y`` ``(B,H,n,d)`` in ``q``'s dtype, stored token-major (``(B,n,H,d)`` memory, as flash attention
    writes its output: the heads merge into ``(B, n, H·d)`` as a view, so the output the backward keeps is the
    tensor the layer's output projection keeps), and the base-2 log-sum-exp of ``C``'s rows ``(B,H,n)``.
    """
    B, H, n, d = q.shape
    m = k_sel.shape[2]
    cfg = launch.config("_out_fwd", n, m, d, q)
    out = token_major(q)
    lse = torch.empty(B, H, n, device=q.device, dtype=torch.float32)
    launch.launch(
        "_out_fwd", (B * H, triton.cdiv(n, cfg.constexprs["BLOCK_N"])), cfg,
        q, k_sel, valid_k.to(torch.uint8), w, rv, slot, out, lse,
        q.stride(0), q.stride(1), q.stride(2), out.stride(0), out.stride(1), out.stride(2),
        H, n, d, _scale(d),
        loop=("slots", triton.cdiv(m, cfg.constexprs["BLOCK_M"])),
    )
    return out, lse


def _strides(*tensors: torch.Tensor) -> list[int]:
    return [s for t in tensors for s in t.stride()[:3]]


def rv_backward(q_sel, k, v, key_mask, rv, lse, d_rv):
    """Gradients of kernel (a): ``dQ_I`` float32 ``(B,H,m,d)``, ``dK, dV`` ``(B,H,n,d)`` in ``k``'s dtype."""
    B, H, m, d = q_sel.shape
    n = k.shape[2]
    d_rv = d_rv.float().contiguous()
    delta = (d_rv * rv).sum(-1)  # Δ_R (B, H, m)
    mask = key_mask.to(torch.uint8)
    dk = torch.empty(B, H, n, d, device=k.device, dtype=k.dtype)
    dv = torch.empty_like(dk)
    common = (*_strides(k, v), mask.stride(0))
    qk_scale, sm_scale = _scale(d), d**-0.5
    cfg = launch.config("_rv_bwd_kv", n, m, d, q_sel)
    launch.launch(
        "_rv_bwd_kv", (B * H, triton.cdiv(n, cfg.constexprs["BLOCK_N"])), cfg,
        q_sel, k, v, mask, d_rv, lse, delta, dk, dv, *common, H, n, d, qk_scale, sm_scale,
        loop=("slots", triton.cdiv(m, cfg.constexprs["BLOCK_M"])),
    )
    cfg = launch.config("_rv_bwd_q", n, m, d, q_sel)
    parts, split_n = _split("_rv_bwd_q", cfg, B * H, n, m)
    dq_sel = _partials(B, H, parts, m, d, like=k)
    launch.launch(
        "_rv_bwd_q", (B * H, m // cfg.constexprs["BLOCK_M"], parts), cfg,
        q_sel, k, v, mask, d_rv, lse, delta, dq_sel, *common, H, n, d, m, split_n, qk_scale, sm_scale,
        loop=("keys", triton.cdiv(split_n, cfg.constexprs["BLOCK_N"])),
    )
    return dq_sel.sum(2) if parts > 1 else dq_sel, dk, dv


def out_backward(q, k_sel, valid_k, w, slot, out, lse, d_out):
    """Gradients of the ``C W`` part of kernel (c): ``dQ`` ``(B,H,n,d)`` in ``q``'s dtype, ``dK_J, dW`` float32
    ``(B,H,m,d)``; ``out`` is :func:`out_forward`'s ``Y``, which gives ``Δ_C``."""
    B, H, n, d = q.shape
    m = k_sel.shape[2]
    if d_out.stride(-1) != 1:
        d_out = d_out.contiguous()
    dq = torch.empty(B, H, n, d, device=q.device, dtype=q.dtype)
    delta = torch.empty(B, H, n, device=q.device, dtype=torch.float32)
    common = _strides(q, d_out)
    valid_k = valid_k.to(torch.uint8)
    qk_scale, sm_scale = _scale(d), d**-0.5
    cfg = launch.config("_out_bwd_q", n, m, d, q)
    launch.launch(
        "_out_bwd_q", (B * H, triton.cdiv(n, cfg.constexprs["BLOCK_N"])), cfg,
        q, k_sel, valid_k, w, slot, d_out, out, lse, dq, delta, *common, *_strides(out), H, n, d, qk_scale, sm_scale,
        loop=("slots", triton.cdiv(m, cfg.constexprs["BLOCK_M"])),
    )
    cfg = launch.config("_out_bwd_kw", n, m, d, q)
    parts, split_n = _split("_out_bwd_kw", cfg, B * H, n, m)
    dk_sel, dw = _partials(B, H, parts, m, d, like=q), _partials(B, H, parts, m, d, like=q)
    launch.launch(
        "_out_bwd_kw", (B * H, m // cfg.constexprs["BLOCK_M"], parts), cfg,
        q, k_sel, valid_k, w, slot, d_out, lse, delta, dk_sel, dw, *common, H, n, d, m, split_n, qk_scale, sm_scale,
        loop=("queries", triton.cdiv(split_n, cfg.constexprs["BLOCK_N"])),
    )
    return (dq, dk_sel.sum(2), dw.sum(2)) if parts > 1 else (dq, dk_sel, dw)
