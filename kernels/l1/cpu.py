"""Exact L1-distance attention on the CPU (EcoTransformer, Gao & Xu 2025, eq. 1; the method: :mod:`attention.l1`,
:class:`attention.scores.L1Score`; docs/design.md §2 "L1 attention"): the bindings of ``cpu.cpp`` and the two
autograd nodes over them. The plain PyTorch reference the tests compare against: :mod:`kernels.l1.naive`.

The two L1-specific contractions, float32 and float64 on CPU, n²d work each like a matmul, in register tiles of the
vector size (:func:`kernels.common.build.vector_bytes`):

* :func:`distance` ``out[p, i, j] = scale · ‖q[p, i] − k[p, j]‖₁``;
* :func:`sign_grad` ``dq[p, i] = scale Σ_j g_pij sign(q_pi − k_pj)``, ``dk[p, j] −= scale Σ_i g_pij sign(…)``.

Whether the kernels can run, :func:`uses_kernel`: CPU tensors outside ``torch.compile`` run them (they have no
PyTorch form to fall back on: without a compiler the first call raises, no silent fallback on CPU); elsewhere
:class:`L1Distance` runs ``torch.cdist`` and a query-chunked backward, and :mod:`attention.l1` FlashL1 or the
materialised weights.

:class:`L1AttentionFunction`, the whole attention on CPU. Per head, with ``c = −λ/√d`` and a pad mask on the keys::

    S_ij = c ‖q_i − k_j‖₁ (+ mask),   P = softmax_j(S),   Y = P V                       (forward)
    dV = Pᵀ dY,   dP = dY Vᵀ,   dS_ij = P_ij (dP_ij − δ_i),   δ_i = dY_i · Y_i
    dq_i = c Σ_j dS_ij sign(q_i − k_j),   dk_j = −c Σ_i dS_ij sign(q_i − k_j)                (backward)

with ``sign(0) = 0`` (``torch.sign``): ``S`` and ``dq, dk`` by the kernels, everything else (softmax, the ``P V``-type
GEMMs) by PyTorch. Flash-style: it walks query chunks of ``chunk`` rows so that at most a few ``(B·H, chunk, n)``
blocks are alive (``budget`` elements each), saves only ``q, k, v, Y`` and the log-sum-exp ``L_i`` for backward
(never an n×n matrix), and recomputes ``P = exp(S − L)`` chunk by chunk in backward. Attention dropout (training)
drops entries of ``P`` with a mask drawn per chunk from a seeded generator, regenerated in backward (``δ`` is
unchanged: ``Σ_j P_ij dP_ij = dY_i · Y_i``).
"""

from __future__ import annotations

import ctypes
import functools
import math

import torch

from kernels.common.build import I64, PTR, load, source, vector_bytes


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """The compiled kernels (built on first call; raises without a compiler)."""
    signatures = {}
    for suffix, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        signatures[f"l1_distance_{suffix}"] = [PTR, I64, PTR, PTR, I64, I64, I64, I64, real, ctypes.c_int]
        signatures[f"l1_sign_grad_{suffix}"] = [PTR, PTR, I64, PTR, PTR, PTR, I64, I64, I64, I64, real, ctypes.c_int]
    return load(source("l1/cpu.cpp"), "l1_vector_bytes", signatures)


def _kernel(name: str, *tensors: torch.Tensor):
    """The kernel ``name`` for the dtype of ``tensors`` (all float32 or all float64, on CPU: raw pointers follow)."""
    kinds = {(x.dtype, x.device.type) for x in tensors}
    if kinds not in ({(torch.float32, "cpu")}, {(torch.float64, "cpu")}):
        raise ValueError(f"the L1 CPU kernels take CPU tensors, all float32 or all float64; got {sorted(map(str, kinds))}")
    return getattr(library(), f"{name}_{'f32' if tensors[0].dtype == torch.float32 else 'f64'}")


def _rows_view(x: torch.Tensor) -> int:
    """Elements between problems of ``x`` ``(P, rows, d)`` whose rows are contiguous (e.g. a row slice)."""
    if x.stride(-1) != 1 or x.stride(-2) != x.shape[-1]:
        raise ValueError(f"expected rows of contiguous d-vectors, got strides {x.stride()} for shape {tuple(x.shape)}")
    return x.stride(0)


def distance(q: torch.Tensor, kt: torch.Tensor, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``out[p, i, j] = scale · ‖q[p, i] − k[p, j]‖₁`` ``(P, a, b)`` from ``q`` ``(P, a, d)`` (rows contiguous,
    e.g. a row slice) and the transposed keys ``kt`` ``(P, d, b)`` (contiguous)."""
    problems, a, d = q.shape
    b = kt.shape[-1]
    kt = kt.contiguous()
    out = torch.empty(problems, a, b, dtype=q.dtype) if out is None else out
    if kt.shape != (problems, d, b) or out.shape != (problems, a, b) or not out.is_contiguous():
        raise ValueError(f"distance: q {tuple(q.shape)}, kt {tuple(kt.shape)}, out {tuple(out.shape)} do not match")
    _kernel("l1_distance", q, kt, out)(q.data_ptr(), _rows_view(q), kt.data_ptr(), out.data_ptr(), problems, a, b, d,
                                       scale, torch.get_num_threads())
    return out


def pad_columns(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(..., d)`` contiguous, zero-padded to a multiple of the vector width (sign(0 − 0) = 0 adds nothing)."""
    width = vector_bytes() // x.element_size()
    extra = -x.shape[-1] % width
    return torch.nn.functional.pad(x, (0, extra)).contiguous() if extra else x.contiguous()


def sign_grad(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, scale: float):
    """``dq[p, i] = scale Σ_j g_pij sign(q_pi − k_pj)`` (written), ``dk[p, j] −= scale Σ_i g_pij sign(…)``.

    ``g`` ``(P, a, b)`` contiguous; ``q``, ``dq`` ``(P, a, d)`` with contiguous rows (may be row slices of
    the same stride); ``k``, ``dk`` ``(P, b, d)`` contiguous; ``d`` a multiple of :func:`pad_columns`' width.
    """
    problems, a, d = q.shape
    b = k.shape[1]
    if (d * q.element_size()) % vector_bytes() or _rows_view(q) != _rows_view(dq) or not k.is_contiguous():
        raise ValueError(f"sign_grad: pad d ({d}) with pad_columns, give q and dq the same strides, contiguous k")
    if not (g.is_contiguous() and dk.is_contiguous() and g.shape == (problems, a, b) and dk.shape == k.shape
            and dq.shape == q.shape and k.shape == (problems, b, d)):
        raise ValueError(f"sign_grad: g {tuple(g.shape)}, k {tuple(k.shape)}, dk {tuple(dk.shape)} do not match")
    _kernel("l1_sign_grad", g, q, k, dq, dk)(g.data_ptr(), q.data_ptr(), _rows_view(q), k.data_ptr(), dq.data_ptr(),
                                             dk.data_ptr(), problems, a, b, d, scale, torch.get_num_threads())


def uses_kernel(x: torch.Tensor) -> bool:
    """The backend of every L1 op (:class:`L1Distance`, :class:`L1AttentionFunction`, the L1 form of the landmark
    kernels): whether L1 scores of ``x`` run the compiled kernels (CPU tensors, outside ``torch.compile``: a ctypes
    call would break its graph; compiled code runs the PyTorch forms)."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


L1_GRAD_BUDGET = 1 << 24  # elements of the sign tensor alive at a time in L1Distance's PyTorch backward


def _query_chunk(a: int, b: int, d: int, batch: int, budget: int) -> int:
    """Rows of queries per chunk so that a ``(batch, chunk, b, d)`` temporary holds <= ``budget`` elements."""
    return max(1, min(a, budget // max(1, batch * b * d)))


class L1Distance(torch.autograd.Function):
    """``scale · ‖q_i − k_j‖₁`` ``(..., a, b)`` from ``q`` ``(..., a, d)`` and ``k`` ``(..., b, d)`` (same ``...``).

    Backward: ``∂D_ij/∂q_i = scale · sign(q_i − k_j)``, ``∂D_ij/∂k_j = −scale · sign(q_i − k_j)``
    (``sign(0) = 0``). Where :func:`uses_kernel`, both directions are :func:`distance` and :func:`sign_grad` (no
    ``(a, b, d)`` tensor at all). Elsewhere: ``torch.cdist(p=1)`` forward and a query-chunked backward with at most
    :data:`L1_GRAD_BUDGET` elements of a ``(..., chunk, b, d)`` sign tensor alive at a time.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, scale: float = 1.0, kernel: bool = True) -> torch.Tensor:
        ctx.save_for_backward(q, k)
        ctx.scale, ctx.kernel = scale, kernel and uses_kernel(q)  # kernel=False: the PyTorch form (attention.impl)
        if not ctx.kernel:
            return torch.cdist(q, k, p=1.0).mul_(scale)
        if q.shape[:-2] != k.shape[:-2]:
            raise ValueError(f"L1Distance: q {tuple(q.shape)} and k {tuple(k.shape)} need the same leading dims")
        out = q.new_empty(*q.shape[:-1], k.shape[-2])  # (..., a, b); not a view: callers softmax it in place
        q3, k3 = q.reshape(-1, *q.shape[-2:]).contiguous(), k.reshape(-1, *k.shape[-2:])
        distance(q3, k3.transpose(1, 2), scale, out=out.view(-1, *out.shape[-2:]))
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        q, k = ctx.saved_tensors
        if ctx.kernel:
            *_, a, d = q.shape
            q3, k3 = (pad_columns(x.reshape(-1, *x.shape[-2:])) for x in (q, k))
            grad_q, grad_k = torch.empty_like(q3), torch.zeros_like(k3)
            sign_grad(grad.reshape(-1, a, k.shape[-2]).contiguous(), q3, k3, grad_q, grad_k, ctx.scale)
            grad_q, grad_k = grad_q[..., :d].reshape(q.shape), grad_k[..., :d].reshape(k.shape)
        else:
            grad_q, grad_k = L1Distance.torch_backward(grad * ctx.scale, q, k, *ctx.needs_input_grad[:2])
        return (grad_q if ctx.needs_input_grad[0] else None), (grad_k if ctx.needs_input_grad[1] else None), None, None

    @staticmethod
    def torch_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, needs_q: bool, needs_k: bool):
        """``(Σ_j g_ij sign(q_i − k_j), −Σ_i g_ij sign(q_i − k_j))``, chunks of a ``(B, H, c, b, d)`` tensor."""
        batch, heads, a, d = q.shape
        chunk = _query_chunk(a, k.shape[-2], d, batch * heads, L1_GRAD_BUDGET)  # a module constant: Dynamo cannot
        # read a class attribute of an autograd Function in its backward
        grad_q = torch.empty_like(q) if needs_q else None
        grad_k = torch.zeros_like(k) if needs_k else None
        for start in range(0, a, chunk):
            rows = slice(start, start + chunk)
            sign = torch.sign(q[:, :, rows, None, :] - k[:, :, None, :, :])  # (B, H, c, b, d)
            g = grad[:, :, rows, :, None]  # (B, H, c, b, 1)
            if grad_q is not None:
                grad_q[:, :, rows] = (g * sign).sum(-2)
            if grad_k is not None:
                grad_k -= (g * sign).sum(-3)
        return grad_q, grad_k


def _keep(seed: int, start: int, shape: torch.Size, p: float, dtype: torch.dtype) -> torch.Tensor:
    """Dropout multipliers (0 or 1/(1 − p)) of the chunk starting at query ``start``, reproducible from ``seed``."""
    generator = torch.Generator().manual_seed(seed + start)
    return torch.rand(shape, generator=generator, dtype=dtype).ge_(p).div_(1.0 - p)


class L1AttentionFunction(torch.autograd.Function):
    """``softmax(−λ‖q_i − k_j‖₁/√d + pad mask) V`` for ``q, k, v`` ``(B, H, n, d)`` float32/float64 on CPU.

    ``key_mask`` bool ``(B, n)``; ``dropout`` p applied to ``P`` when > 0 (masks from ``seed``). Rows of a
    sequence without any real key are 0 (as :func:`attention.scores.masked_softmax`). Memory beyond the
    inputs: ``Y``, ``L`` and a few ``(B·H, chunk, n)`` blocks, ``chunk = budget // (B·H·n)``.
    """

    budget = 1 << 21

    @staticmethod
    def chunk_rows(problems: int, n: int) -> int:
        rows = L1AttentionFunction.budget // max(1, problems * n)
        return max(1, min(n, rows - rows % 8 if rows >= 8 else rows))  # whole 8-row tiles of the kernel

    @staticmethod
    def scores(q, kt, rows, scale, pad):
        """``S`` for query rows ``rows``: ``(B·H, chunk, n)``, pad keys at the lowest finite value."""
        s = distance(q[:, rows], kt, scale)
        if pad is not None:
            heads = s.shape[0] // pad.shape[0]
            s.view(pad.shape[0], heads, *s.shape[1:]).masked_fill_(pad[:, None, None, :], torch.finfo(s.dtype).min)
        return s

    @staticmethod
    def forward(ctx, q, k, v, key_mask, lam: float, dropout: float = 0.0, seed: int = 0):
        batch, heads, n, d = q.shape
        q, k, v = (x.reshape(batch * heads, n, d).contiguous() for x in (q, k, v))
        scale = -lam / math.sqrt(d)
        pad = None if bool(key_mask.all()) else ~key_mask
        kt = k.transpose(1, 2).contiguous()  # (B·H, d, n)
        out, lse = torch.empty_like(v), torch.empty(batch * heads, n, dtype=q.dtype)
        chunk = L1AttentionFunction.chunk_rows(batch * heads, n)
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            s = L1AttentionFunction.scores(q, kt, rows, scale, pad)
            top = s.amax(-1, keepdim=True)
            total = s.sub_(top).exp_().sum(-1, keepdim=True)
            lse[:, rows] = (top + total.log()).squeeze(-1)
            if dropout > 0:
                s.mul_(_keep(seed, start, s.shape, dropout, s.dtype))
            out[:, rows] = torch.bmm(s, v).div_(total)
        empty = ~key_mask.any(-1).repeat_interleave(heads)  # (B·H,): sequences with no real token
        if bool(empty.any()):
            out[empty], lse[empty] = 0.0, math.inf  # P = exp(S − ∞) = 0 in backward
        ctx.save_for_backward(q, k, v, out, lse, key_mask)
        ctx.setup = (batch, heads, scale, dropout, seed)
        return out.view(batch, heads, n, d)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse, key_mask = ctx.saved_tensors
        batch, heads, scale, dropout, seed = ctx.setup
        problems, n, d = q.shape
        grad_out = grad_out.reshape(problems, n, d).to(q.dtype).contiguous()
        delta = (grad_out * out).sum(-1)  # δ_i = dY_i · Y_i, (B·H, n)
        pad = None if bool(key_mask.all()) else ~key_mask
        kt = k.transpose(1, 2).contiguous()
        q_padded, k_padded = pad_columns(q), pad_columns(k)
        grad_q, grad_k, grad_v = torch.empty_like(q_padded), torch.zeros_like(k_padded), torch.zeros_like(v)
        chunk = L1AttentionFunction.chunk_rows(problems, n)
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            p = L1AttentionFunction.scores(q, kt, rows, scale, pad).sub_(lse[:, rows, None]).exp_()  # P rows
            grad_p = torch.bmm(grad_out[:, rows], v.transpose(1, 2))  # dY Vᵀ
            if dropout > 0:
                keep = _keep(seed, start, p.shape, dropout, p.dtype)
                grad_p.mul_(keep)
                grad_v.baddbmm_(keep.mul_(p).transpose(1, 2), grad_out[:, rows])
            else:
                grad_v.baddbmm_(p.transpose(1, 2), grad_out[:, rows])
            grad_s = grad_p.sub_(delta[:, rows, None]).mul_(p)  # dS = P ⊙ (dP − δ)
            sign_grad(grad_s, q_padded[:, rows], k_padded, grad_q[:, rows], grad_k, scale)
        shape = (batch, heads, n, d)
        grads = (grad_q[..., :d].reshape(shape), grad_k[..., :d].reshape(shape), grad_v.view(shape))
        return (*grads, None, None, None, None)
