"""Exact L1-distance attention's one plain PyTorch reference (EcoTransformer, Gao & Xu 2025, eq. 1), what every
form of the method is tested against: the Triton kernels (:mod:`kernels.l1.ops`, :func:`dense_l1`: the full
``(B, H, n, n, d)`` difference, masked as :func:`attention.scores.masked_softmax`, pad keys exactly 0, an all-pad row
all 0) and the C++ kernels (:mod:`kernels.l1.cpu`: :func:`distance`, :func:`weights`, :func:`attention`, the dense
``n × n`` weights, no chunking). Independent of the kernels."""

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


def distance(q: torch.Tensor, k: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``scale · ‖q_i − k_j‖₁`` ``(..., a, b)`` from ``q`` ``(..., a, d)`` and ``k`` ``(..., b, d)``."""
    return (q[..., :, None, :] - k[..., None, :, :]).abs().sum(-1) * scale


def weights(q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor, lam: float = 1.0) -> torch.Tensor:
    """``softmax(−λ‖q_i − k_j‖₁/√d + pad mask)`` ``(B, H, n, n)`` for a bool ``key_mask`` ``(B, n)`` (pad keys at
    −inf; a row without a real key is NaN here, 0 in the kernels)."""
    logits = distance(q, k, -lam / q.shape[-1] ** 0.5)
    return torch.softmax(logits.masked_fill(~key_mask[:, None, None, :], float("-inf")), dim=-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor,
              lam: float = 1.0) -> torch.Tensor:
    """:func:`weights` times ``V`` -> ``(B, H, n, d)``."""
    return weights(q, k, key_mask, lam) @ v
