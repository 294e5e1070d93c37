"""Exact softmax attention (Vaswani et al. 2017), the baseline every variant is compared with.

``Y = softmax(Q Kᵀ / √d + M) V`` with ``M = -inf`` on pad keys, computed by
``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient kernels on GPU: the
papers' "FlashAttention" row), or with ``materialise=True`` as the three explicit steps of the papers'
"Transformer" row (scores, softmax, product; the ``(B, H, n, n)`` weights stored for backward, at most two such
buffers alive, as in the papers' code), the
baseline of the CUR paper's Table 2 speed and memory ratios (``configs/attention/softmax_materialised.yaml``).
Cost O(n² d) time; O(n²) memory for the materialised path, O(n) for the fused kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SoftmaxAttention(nn.Module):
    """Multi-head scaled dot-product attention over ``(B, H, n, d)`` tensors with a key padding mask."""

    def __init__(self, num_heads: int, head_dim: int, dropout: float = 0.0, materialise: bool = False):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"attention.dropout must be in [0, 1), got {dropout}")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dropout = dropout
        self.materialise = materialise

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        attn_mask = key_mask[:, None, None, :]  # (B, 1, 1, n): True = may attend
        if self.materialise:
            return self._materialised(q, k, v, key_mask)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0
        )

    def _materialised(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """Scores, softmax, product, with at most two ``(B, H, n, n)`` buffers alive, as the standard Transformer of
        the papers' code (the Nyströmformer LRA code's softmax keeps ``dot`` and ``attn``): the scale and the pad mask
        are applied to the scores in place (the product's backward keeps ``q`` and ``k``, not its output), and the
        scores are dropped once the softmax has them. A sequence without any real key attends to all its pads (so
        its softmax stays finite) and gets 0 rows afterwards, SDPA's convention."""
        empty = ~key_mask.any(-1)  # (B,): no real key
        attend = (key_mask | empty[:, None])[:, None, None, :]  # (B, 1, 1, n)
        scores = q @ k.transpose(-1, -2)  # (B, H, n, n)
        scores.mul_(self.head_dim**-0.5).masked_fill_(~attend, -torch.inf)
        weights = scores.softmax(-1)
        del scores
        out = F.dropout(weights, self.dropout, self.training) @ v
        return out.masked_fill(empty[:, None, None, None], 0.0)
