"""FlashL1's autograd wrapper: :class:`FlashL1` (the forward and the tiled backward of :mod:`kernels.l1.launch`
as one autograd node) and :func:`flash_l1_attention`, its checked entry point, what :class:`attention.l1.L1Attention`
calls on CUDA. The plain PyTorch reference it is tested against: :mod:`kernels.l1.naive`.

Per (batch, head), with ``q, k, v`` ``(n, d)``, λ > 0 and the key pad mask::

    S_ij = −λ ‖q_i − k_j‖₁ / √d   (−inf on pad keys),   P = softmax_j(S),   Y = P V   (n × d)

Layouts, dtypes and masking: :mod:`kernels.l1.launch`.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from kernels.l1.launch import DTYPES, check_head_dim, l1_backward, l1_forward, unit_stride


class FlashL1(torch.autograd.Function):
    """``Y = softmax(−λ‖q_i − k_j‖₁/√d + pad mask) V`` with the tiled backward of :mod:`kernels.l1.backward`."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, lam):
        q, k, v = (unit_stride(x) for x in (q, k, v))
        out, lse = l1_forward(q, k, v, key_mask, lam)
        ctx.save_for_backward(q, k, v, key_mask, out, lse)
        ctx.lam = lam
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        q, k, v, key_mask, out, lse = ctx.saved_tensors
        dq, dk, dv = l1_backward(q, k, v, key_mask, out, lse, unit_stride(d_out), ctx.lam)
        return dq, dk, dv, None, None


def flash_l1_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor, lam: float = 1.0):
    """EcoTransformer eq. 1: ``softmax(−λ‖q_i − k_j‖₁/√d + pad mask) V``, ``(B, H, n, d)`` in the inputs' dtype.

    ``q, k, v`` ``(B, H, n, d)`` of one dtype (float32 / float16 / bfloat16) on a CUDA device (or CPU under
    ``TRITON_INTERPRET=1``), ``key_mask`` bool ``(B, n)`` (True = real token), ``lam`` = λ > 0.
    Differentiable in ``q, k, v``. O(n² d) time, O(n d) memory.
    """
    if not q.shape == k.shape == v.shape or q.dim() != 4:
        shapes = ", ".join(str(tuple(x.shape)) for x in (q, k, v))
        raise ValueError(f"FlashL1 expects q, k, v of one shape (B, H, n, d), got {shapes}")
    if not q.dtype == k.dtype == v.dtype or q.dtype not in DTYPES:
        raise ValueError(f"FlashL1 expects q, k, v of one dtype among {DTYPES}, got {q.dtype}, {k.dtype}, {v.dtype}")
    if key_mask.dtype != torch.bool or tuple(key_mask.shape) != (q.shape[0], q.shape[2]):
        expected = (q.shape[0], q.shape[2])
        raise ValueError(f"FlashL1 expects key_mask bool (B, n) = {expected}, got {key_mask.dtype} {tuple(key_mask.shape)}")
    if not lam > 0:
        raise ValueError(f"attention.lam (λ of the L1 score) must be > 0, got {lam}")
    check_head_dim(q.shape[-1])
    return FlashL1.apply(q, k, v, key_mask, float(lam))
