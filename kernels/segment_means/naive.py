"""The landmark kernels' plain PyTorch reference, what :mod:`kernels.segment_means.ops` is tested against: each real token
of rank ``r`` (1-based among the ``n_real`` real tokens) in segment ``⌊(r − 1)·m / n_real⌋``, each segment's mean
(0 for an empty one) from a one-hot membership matrix. Independent of the kernels."""

from __future__ import annotations

import torch


def segments(key_mask: torch.Tensor, m: int) -> torch.Tensor:
    """Each token's segment, ``(B, n)`` int64, −1 on pads (``key_mask`` bool ``(B, n)``, True = real)."""
    rank = key_mask.cumsum(-1)  # 1..n_real on real tokens
    n_real = rank[:, -1:].clamp_min(1)
    return torch.where(key_mask, torch.div((rank - 1) * m, n_real, rounding_mode="floor"), -1)


def segment_means(x: torch.Tensor, key_mask: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(means (B, H, m, d), valid (B, m))`` of ``x`` ``(B, H, n, d)`` over the ``m`` segments of its real tokens:
    ``X̃_s = Σ_{t ∈ s} X_t / |s|`` (0 for an empty segment, pads never read: a NaN there stays out)."""
    members = (segments(key_mask, m)[:, None, :] == torch.arange(m, device=x.device)[:, None]).to(x.dtype)  # (B, m, n)
    counts = members.sum(-1)  # (B, m)
    real = x.masked_fill(~key_mask[:, None, :, None], 0.0)
    means = members[:, None] @ real / counts.clamp_min(1)[:, None, :, None]
    return means, counts > 0
