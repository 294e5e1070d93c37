"""FlashL1's plain PyTorch reference (EcoTransformer, Gao & Xu 2025, eq. 1), what :mod:`kernels.flashl1.ops` is
tested against: the full ``(B, H, n, n, d)`` difference, masked as :func:`attention.scores.masked_softmax` (pad keys
exactly 0, an all-pad row all 0). Independent of the kernels."""

from __future__ import annotations

import math

import torch


def dense_l1(q, k, v, key_mask, lam):
    """``softmax(−λ‖q_i − k_j‖₁/√d)`` over real keys (others exactly 0, an all-pad row all 0) times ``V``:
    ``q, k, v`` ``(B, H, n, d)``, ``key_mask`` bool ``(B, n)`` -> ``(B, H, n, d)`` (run it in float64)."""
    distance = (q[:, :, :, None, :] - k[:, :, None, :, :]).abs().sum(-1)  # (B, H, n, n)
    logits = (-lam / math.sqrt(q.shape[-1]) * distance).masked_fill(~key_mask[:, None, None, :], torch.finfo(q.dtype).min)
    weights = torch.softmax(logits, dim=-1) * key_mask.any(-1)[:, None, None, None]
    return weights @ v
