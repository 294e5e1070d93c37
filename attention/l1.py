"""L1-distance attention (EcoTransformer, Gao & Xu 2025, eq. 1; DESIGN §2).

``Y = softmax(−λ ‖q_i − k_j‖₁ / √d + pad mask) V`` per head: keys close to the query in L1
distance get the largest weights. The scores come from :class:`attention.scores.L1Score`
(float32 with autocast disabled, ``cdist`` forward, query-chunked backward: never a
``(B, H, n, n, d)`` tensor beyond one chunk). Cost O(n² d) time, O(n²) memory for the weights.
λ = 1 by default (the paper's "robust" setting is 3). No parameters of its own, so a softmax
checkpoint loads with ``strict=True``.
"""

from __future__ import annotations

import torch
from torch import nn

from attention.scores import L1Score


class L1Attention(nn.Module):
    """Exact attention with the L1 score; ``dropout`` on the weights during training (as softmax)."""

    def __init__(self, num_heads: int, head_dim: int, lam: float = 1.0, dropout: float = 0.0):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"attention.dropout must be in [0, 1), got {dropout}")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.score = L1Score(lam)
        self.dropout = nn.Dropout(dropout)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        weights = self.score(q, k, key_mask[:, None, None, :])  # (B, H, n, n), float32
        return (self.dropout(weights) @ v.to(weights.dtype)).to(v.dtype)
