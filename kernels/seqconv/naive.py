"""Plain PyTorch references of Nyström's sequence kernels (:mod:`kernels.seqconv.cpu`): the depthwise conv as
``F.conv2d`` with ``groups = H`` (the former ``nn.Conv2d`` layout) and the segment sums as a ``scatter_add``."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def conv(x: torch.Tensor, weight: torch.Tensor, in_mask: torch.Tensor | None = None,
         out_mask: torch.Tensor | None = None, base: torch.Tensor | None = None) -> torch.Tensor:
    """``base + out_mask ⊙ conv(x ⊙ in_mask)`` ``(B, H, n, d)``: ``y_i = Σ_t w[h, t] x_{i+t−K//2}`` (zero outside the
    sequence) for ``weight`` ``(H, K)``, odd ``K``, masks ``(B, n)`` or None."""
    heads, size = weight.shape
    if in_mask is not None:
        x = x * in_mask[:, None, :, None]
    y = F.conv2d(x, weight[:, None, :, None], padding=(size // 2, 0), groups=heads)
    if out_mask is not None:
        y = y * out_mask[:, None, :, None]
    return y if base is None else base + y


def segment_sums(x: torch.Tensor, segment: torch.Tensor, m: int) -> torch.Tensor:
    """``sums[b, h, s] = Σ_{i: segment[b, i] = s} x[b, h, i]`` ``(B, H, m, d)``; rows whose segment is outside
    ``[0, m)`` are left out."""
    batch, heads, n, d = x.shape
    inside = (segment >= 0) & (segment < m)
    index = torch.where(inside, segment, m)[:, None, :, None].expand(batch, heads, n, d)
    return x.new_zeros(batch, heads, m + 1, d).scatter_add_(2, index, x)[:, :, :m]
