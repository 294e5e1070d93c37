"""Plain PyTorch references of the L1 kernels (:mod:`kernels.cpu.l1.ops`): the full ``(…, a, b, d)`` difference
and dense ``n × n`` weights, no chunking (the tests' ground truth for :func:`kernels.cpu.l1.ops.distance`,
:class:`kernels.cpu.l1.ops.L1Distance` and :class:`kernels.cpu.l1.ops.L1AttentionFunction`)."""

from __future__ import annotations

import torch


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
