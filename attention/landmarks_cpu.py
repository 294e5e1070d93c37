"""Landmark attention on the CPU kernels of :mod:`kernels.cpu.landmarks` as an autograd node (float32): softmax or
L1-score attention where one side is a few landmarks.

:func:`attend` is ``F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)`` (or its L1-score form), by the
few-keys or few-queries kernel where :func:`kernels.cpu.landmarks.kernel_for` names one, else SDPA;
:class:`LandmarkAttention` backpropagates by the backward kernels, or for dot products by ATen's flash-attention
backward where they cannot run (no compiler, a dispatch mode). Proxyformer keeps SDPA (docs/bench.md, "Landmark
kernels on CPU").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.cpu import landmarks


class LandmarkAttention(torch.autograd.Function):
    """``softmax(scale · Q Kᵀ + bias) V`` (``l1``: ``softmax(scale · ‖q_i − k_j‖₁ + bias) V``) by the kernel ``kind``;
    backward by its backward kernel, or for dot products ATen's flash-attention backward where that does not apply
    (no compiler, a dispatch mode)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, scale: float, kind: str, l1: bool):
        y, row_max, row_sum = landmarks.FORWARDS[kind](q, k, v, bias, scale, l1)
        lse = row_sum.log_().add_(row_max) if any(ctx.needs_input_grad[:3]) else None
        ctx.save_for_backward(q, k, v, bias, y, lse)
        ctx.scale, ctx.kind, ctx.l1 = scale, kind, l1
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        q, k, v, bias, y, lse = ctx.saved_tensors
        grad = grad if grad.stride(-1) == 1 else grad.contiguous()  # e.g. the expanded gradient of a sum
        if landmarks.kernel_takes(grad) and landmarks.backward_library() is not None:
            grads = landmarks.BACKWARDS[ctx.kind](grad, q, k, v, bias, y, lse, ctx.scale, ctx.l1)
        elif ctx.l1:
            raise RuntimeError("the backward of L1 landmark attention runs only by its CPU kernel, which cannot run "
                               "inside torch.compile or a dispatch mode: run the forward there too (it then takes "
                               "the PyTorch form of attention.scores.L1Score)")
        else:
            grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad, q, k, v, y, lse, 0.0, False, attn_mask=bias, scale=ctx.scale)
        return *grads, None, None, None, None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
           l1_scale: float | None = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)`` (default scale ``1/√d``), by a kernel where
    :func:`kernels.cpu.landmarks.kernel_for` names one; ``key_mask`` bool broadcasting to ``(B, H, 1, n_keys)`` or None.

    With ``l1_scale`` ``c``: ``softmax(c · ‖q_i − k_j‖₁ + log M) V`` (L1 scores, ``c = −λ/√d``), by a kernel only
    (the caller checks ``kernel_for`` and ``backward_library`` of :mod:`kernels.cpu.landmarks`; :class:`attention.scores.L1Score` does)."""
    kind = landmarks.kernel_for(q, k, v, key_mask)
    if kind is None and l1_scale is not None:
        raise ValueError("landmarks_cpu.attend with L1 scores needs a kernel (kernel_for names none for these operands)")
    if kind is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
    batch, heads = torch.broadcast_shapes(q.shape[:2], k.shape[:2], v.shape[:2])
    q, k, v = (x.expand(batch, heads, *x.shape[2:]) for x in (q, k, v))
    bias = landmarks.key_bias(key_mask, batch, heads, k.shape[-2], q)
    scale = q.shape[-1] ** -0.5 if l1_scale is None else l1_scale
    return LandmarkAttention.apply(q, k, v, bias, scale, kind, l1_scale is not None)
