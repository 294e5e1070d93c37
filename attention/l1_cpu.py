"""CPU kernels of exact L1-distance attention (EcoTransformer, Gao & Xu 2025, eq. 1; docs/design.md §2 "L1 attention").

Per head, with ``c = −λ/√d`` and a pad mask on the keys::

    S_ij = c ‖q_i − k_j‖₁ (+ mask),   P = softmax_j(S),   Y = P V                       (forward)
    dV = Pᵀ dY,   dP = dY Vᵀ,   dS_ij = P_ij (dP_ij − δ_i),   δ_i = dY_i · Y_i
    dq_i = c Σ_j dS_ij sign(q_i − k_j),   dk_j = −c Σ_i dS_ij sign(q_i − k_j)                (backward)

with ``sign(0) = 0`` (``torch.sign``). The two L1-specific contractions (``S`` from ``q, k``; ``dq, dk``
from ``dS``) are the vectorised C++ kernels of :mod:`kernels.cpu.l1` (``distance``, ``sign_grad``),
n²d work each like a matmul; everything else is PyTorch (softmax, the ``P V``-type GEMMs).

:class:`L1AttentionFunction` is flash-style: it walks query chunks of ``chunk`` rows so that at most a few
``(B·H, chunk, n)`` blocks are alive (``budget`` elements each), saves only ``q, k, v, Y`` and the
log-sum-exp ``L_i`` for backward (never an n×n matrix), and recomputes ``P = exp(S − L)`` chunk by chunk
in backward. Attention dropout (training) drops entries of ``P`` with a mask drawn per chunk from a
seeded generator, regenerated in backward (``δ`` is unchanged: ``Σ_j P_ij dP_ij = dY_i · Y_i``).

The kernels are built on first use (:mod:`kernels.cpu.build`); without a compiler they raise: there is no silent
fallback on CPU. Other devices use the PyTorch path of :mod:`attention.scores`.
"""

from __future__ import annotations

import math

import torch

from kernels.cpu.l1 import distance, pad_columns, sign_grad


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
