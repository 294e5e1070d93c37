"""Nyström's depthwise sequence conv (:class:`attention.nystrom.SequenceConv`; docs/design.md §2) and its landmarks'
segment sums (:class:`SegmentSums`) as autograd nodes over the CPU kernels of :mod:`kernels.cpu.seqconv`.

Per head ``h`` with kernel ``w[h]`` of odd size ``K`` and pad mask ``m``::

    y_i = base_i + Σ_t w[h, t] · m_j x_j,   j = i + t − K//2   (zero outside the sequence)
    ∂x_j = m_j Σ_t w[h, t] g_{j − t + K//2},   ∂w[h, t] = Σ_{b,i} m_j (g_i · x_j),   ∂base = g

The gradient of x is the same conv with the reversed kernel, masked on output. Measured: docs/bench.md ("CUR's
backward without full-size copies, and Nyström's sequence kernels").
"""

from __future__ import annotations

import torch

from kernels.cpu.seqconv import conv, segment_sums, weight_grad


class ConvFunction(torch.autograd.Function):
    """``base + conv(x ⊙ mask)`` by the CPU kernels: backward is the same conv of the gradient with the reversed
    kernel, masked on output, and ``∂/∂w[h, t] = Σ_{b,i} g_i · (x ⊙ mask)_{i+t−K//2}`` (``seqconv_weight_grad``)."""

    @staticmethod
    def forward(ctx, x, weight, mask, base):
        ctx.save_for_backward(x, weight, mask)
        return conv(x, weight, in_mask=mask, base=base)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight, mask = ctx.saved_tensors
        if grad.stride(-1) != 1:
            grad = grad.contiguous()
        grad_x = conv(grad, weight.flip(-1), out_mask=mask) if ctx.needs_input_grad[0] else None
        grad_w = weight_grad(grad, x, mask, weight.shape[-1]) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, grad if ctx.needs_input_grad[3] else None


class SegmentSums(torch.autograd.Function):
    """``sums[b, h, s] = Σ_{i: segment[b, i] = s} x[b, h, i]`` ``(B, H, m, d)`` for ``x`` ``(B, H, n, d)`` (rows
    contiguous) and long ``segment`` ``(B, n)``; rows whose segment is outside ``[0, m)`` (padding) are left out.
    One pass over ``x`` in any layout (:func:`kernels.cpu.seqconv.segment_sums`), where a ``scatter_add`` reads an
    index per element; backward gives each row its segment's gradient (0 for left-out rows)."""

    @staticmethod
    def forward(ctx, x, segment, m: int):
        segment = segment.contiguous()
        ctx.save_for_backward(segment)
        return segment_sums(x, segment, m)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (segment,) = ctx.saved_tensors
        batch, heads, m, d = grad.shape
        padded = torch.cat([grad, grad.new_zeros(batch, heads, 1, d)], 2)  # segment m (and beyond): 0
        index = segment.clamp(0, m)[:, None, :, None].expand(batch, heads, segment.shape[-1], d)
        return padded.gather(2, index), None, None
