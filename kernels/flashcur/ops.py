"""The Python side of the FlashCUR kernels: one function per kernel (pair), which allocates the outputs,
takes the launch parameters for this shape, dtype and GPU (:func:`kernels.flashcur.launch.config`) and
launches (:func:`kernels.flashcur.launch.launch`). The custom ops that wrap them (fake implementations,
autograd) and chain them (with ``W = pinv(U) RV`` in PyTorch between kernels b and c) are in
:mod:`attention.flashcur`.

Forward: :func:`rv_forward` (kernel a), :func:`u_forward` (kernel b), :func:`out_forward` (kernel c)
of :mod:`kernels.flashcur.forward`; backward: :func:`rv_backward` (kernel a's gradients) and
:func:`out_backward` (the ``C W`` part of kernel c) of :mod:`kernels.flashcur.backward`. Shapes are
``(B, H, ·, d)``; see those modules for the equations and layouts.
"""

from __future__ import annotations

import math

import torch
import triton

from kernels.flashcur.launch import config, launch

LOG2E = 1.4426950408889634


def _scale(d: int) -> float:
    return LOG2E / math.sqrt(d)


def rv_forward(q_sel: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor):
    """Kernel (a). ``q_sel`` ``(B,H,m,d)``, ``k, v`` ``(B,H,n,d)``, ``key_mask`` bool ``(B,n)``.

    Returns ``RV`` float32 ``(B,H,m,d)`` and the base-2 log-sum-exp of ``R``'s rows, float32 ``(B,H,m)``.
    """
    B, H, m, d = q_sel.shape
    n = k.shape[2]
    cfg = config("_rv_fwd", n, m, d, q_sel)
    rv = torch.empty(B, H, m, d, device=q_sel.device, dtype=torch.float32)
    lse = torch.empty(B, H, m, device=q_sel.device, dtype=torch.float32)
    mask = key_mask.to(torch.uint8)
    launch(
        "_rv_fwd", (B * H, m // cfg.constexprs["BLOCK_M"]), cfg,
        q_sel, k, v, mask, rv, lse,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), mask.stride(0),
        H, n, d, m, _scale(d),
    )
    return rv, lse


def u_forward(q_sel: torch.Tensor, k_sel: torch.Tensor, valid_k: torch.Tensor) -> torch.Tensor:
    """Kernel (b). ``q_sel, k_sel`` ``(B,H,m,d)``, ``valid_k`` bool ``(B,H,m)`` (usable key slots)
    -> ``U = softmax(s·Q_I K_Jᵀ)`` over the valid slots, float32 ``(B,H,m,m)``."""
    B, H, m, d = q_sel.shape
    cfg = config("_u_fwd", m, m, d, q_sel)
    u = torch.empty(B, H, m, m, device=q_sel.device, dtype=torch.float32)
    launch("_u_fwd", (B * H, m // cfg.constexprs["BLOCK_M"]), cfg, q_sel, k_sel, valid_k.to(torch.uint8), u, d, _scale(d))
    return u


def out_forward(q, k_sel, valid_k, w, rv, slot):
    """Kernel (c). ``q`` ``(B,H,n,d)``, ``k_sel`` ``(B,H,m,d)``, ``valid_k`` bool ``(B,H,m)`` (the
    columns of ``C`` to keep), ``w, rv`` float32 ``(B,H,m,d)``,
    ``slot`` int32 ``(B,H,n)`` (position of each row in ``I``, −1 if not selected).

    Returns ``Y`` ``(B,H,n,d)`` in ``q``'s dtype and the base-2 log-sum-exp of ``C``'s rows ``(B,H,n)``.
    """
    B, H, n, d = q.shape
    m = k_sel.shape[2]
    cfg = config("_out_fwd", n, m, d, q)
    out = torch.empty(B, H, n, d, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, H, n, device=q.device, dtype=torch.float32)
    launch(
        "_out_fwd", (B * H, triton.cdiv(n, cfg.constexprs["BLOCK_N"])), cfg,
        q, k_sel, valid_k.to(torch.uint8), w, rv, slot, out, lse,
        q.stride(0), q.stride(1), q.stride(2), out.stride(0), out.stride(1), out.stride(2),
        H, n, d, _scale(d),
    )
    return out, lse


def _strides(*tensors: torch.Tensor) -> list[int]:
    return [s for t in tensors for s in t.stride()[:3]]


def rv_backward(q_sel, k, v, key_mask, rv, lse, d_rv):
    """Gradients of kernel (a): ``(dQ_I (B,H,m,d), dK (B,H,n,d), dV (B,H,n,d))``, all float32."""
    B, H, m, d = q_sel.shape
    n = k.shape[2]
    d_rv = d_rv.float().contiguous()
    delta = (d_rv * rv).sum(-1)  # Δ_R (B, H, m)
    mask = key_mask.to(torch.uint8)
    dk = torch.empty(B, H, n, d, device=k.device, dtype=torch.float32)
    dv = torch.empty_like(dk)
    dq_sel = torch.empty(B, H, m, d, device=k.device, dtype=torch.float32)
    common = (*_strides(k, v), mask.stride(0))
    qk_scale, sm_scale = _scale(d), d**-0.5
    cfg = config("_rv_bwd_kv", n, m, d, q_sel)
    launch(
        "_rv_bwd_kv", (B * H, triton.cdiv(n, cfg.constexprs["BLOCK_N"])), cfg,
        q_sel, k, v, mask, d_rv, lse, delta, dk, dv, *common, H, n, d, qk_scale, sm_scale,
    )
    cfg = config("_rv_bwd_q", n, m, d, q_sel)
    launch(
        "_rv_bwd_q", (B * H, m // cfg.constexprs["BLOCK_M"]), cfg,
        q_sel, k, v, mask, d_rv, lse, delta, dq_sel, *common, H, n, d, m, qk_scale, sm_scale,
    )
    return dq_sel, dk, dv


def out_backward(q, k_sel, valid_k, w, slot, lse, d_out):
    """Gradients of the ``C W`` part of kernel (c): ``(dQ (B,H,n,d), dK_J (B,H,m,d), dW (B,H,m,d))``, float32."""
    B, H, n, d = q.shape
    m = k_sel.shape[2]
    if d_out.stride(-1) != 1:
        d_out = d_out.contiguous()
    dq = torch.empty(B, H, n, d, device=q.device, dtype=torch.float32)
    delta = torch.empty(B, H, n, device=q.device, dtype=torch.float32)
    dk_sel = torch.empty(B, H, m, d, device=q.device, dtype=torch.float32)
    dw = torch.empty_like(dk_sel)
    common = _strides(q, d_out)
    valid_k = valid_k.to(torch.uint8)
    qk_scale, sm_scale = _scale(d), d**-0.5
    cfg = config("_out_bwd_q", n, m, d, q)
    launch(
        "_out_bwd_q", (B * H, triton.cdiv(n, cfg.constexprs["BLOCK_N"])), cfg,
        q, k_sel, valid_k, w, slot, d_out, lse, dq, delta, *common, H, n, d, qk_scale, sm_scale,
    )
    cfg = config("_out_bwd_kw", n, m, d, q)
    launch(
        "_out_bwd_kw", (B * H, m // cfg.constexprs["BLOCK_M"]), cfg,
        q, k_sel, valid_k, w, slot, d_out, lse, delta, dk_sel, dw, *common, H, n, d, m, qk_scale, sm_scale,
    )
    return dq, dk_sel, dw
