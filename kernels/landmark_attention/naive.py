"""Plain PyTorch references of the landmark kernels (:mod:`kernels.landmark_attention.cpu`), in float64 with the dense
``a × b`` weights: what tests/kernels/test_landmark_attention_cpu.py compares the kernels' values and gradients against."""

from __future__ import annotations

import torch


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """``softmax(Q Kᵀ/√d + log M) V`` in float64 for ``q`` ``(B, H, a, d)``, ``k, v`` ``(B, H, b, d)`` and a bool
    ``key_mask`` broadcasting to ``(B, H, a, b)``; 0 for a row without a real key."""
    q, k, v = q.double(), k.double(), v.double()
    logits = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    logits = logits.masked_fill(~key_mask, -torch.inf)
    weights = torch.softmax(logits, -1).nan_to_num(0.0)
    return weights @ v


def l1_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor,
                 lam: float) -> torch.Tensor:
    """``softmax(−λ ‖q_i − k_j‖₁/√d + log M) V`` in float64, as :func:`attention` (``torch.cdist``: its gradient
    takes sign(0) = 0, as the kernels do)."""
    q, k, v = q.double(), k.double(), v.double()
    logits = torch.cdist(q, k, p=1.0) * (-lam / q.shape[-1] ** 0.5)
    weights = torch.softmax(logits.masked_fill(~key_mask, -torch.inf), -1).nan_to_num(0.0)
    return weights @ v
