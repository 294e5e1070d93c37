"""Exact softmax attention (Vaswani et al. 2017), the baseline every variant is compared with.

``Y = softmax(Q Kᵀ / √d + M) V`` with ``M = -inf`` on pad keys, computed by
``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient kernels on GPU: the
papers' "FlashAttention" row), or with ``materialise=True`` as the three explicit steps of the papers'
"Transformer" row (scores, softmax, product; the ``(B, H, n, n)`` weights stored for backward), the
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
            scores = (q @ k.transpose(-1, -2)) * self.head_dim**-0.5  # (B, H, n, n)
            weights = scores.masked_fill(~attn_mask, -torch.inf).softmax(-1).nan_to_num(0.0)  # no real key: 0
            return F.dropout(weights, self.dropout, self.training) @ v
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0
        )
