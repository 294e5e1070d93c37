"""Pre-LayerNorm Transformer block and the multi-head wrapper that owns the projections.

Block contract (every block, including MEGA's): ``block(x, key_mask, aux_losses) -> x`` with
``x`` ``(B, n, d_model)``, ``key_mask`` bool ``(B, n)`` (True = real token); a block may add
named scalar losses to ``aux_losses``, which the LightningModule sums into the loss and logs.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from models.dropout import Dropout


class MultiHeadAttention(nn.Module):
    """Projections ``q_proj, k_proj, v_proj, out_proj`` around a drop-in variant ``attend``.

    The projection names and shapes are the same for every variant, so a checkpoint trained with
    one variant loads into another (direct weight transfer). ``attention(num_heads=, head_dim=)`` builds
    the variant (a factory: ``lra.module.attention_factory`` of the attention config).
    """

    def __init__(self, d_model: int, num_heads: int, attention: Callable[..., nn.Module]):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"model.d_model={d_model} is not divisible by model.num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attend = attention(num_heads=num_heads, head_dim=self.head_dim)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n, d_model) -> (B, H, n, head_dim)."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split_heads(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        y = self.attend(q, k, v, key_mask)  # (B, H, n, head_dim)
        return self.out_proj(y.transpose(1, 2).flatten(2))

    def identity_values(self, q: torch.Tensor) -> torch.Tensor:
        """``V = I`` ``(B, H, n, n)`` for queries ``q`` ``(B, H, n, ·)``: ``attend(q, k, V)`` is then the attention
        matrix itself (what :meth:`attention_matrix` returns)."""
        batch, heads, n, _ = q.shape
        return torch.eye(n, dtype=q.dtype, device=q.device).expand(batch, heads, n, n).contiguous()

    def attention_matrix(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """The effective attention ``(B, H, n, n)`` that ``forward(x, key_mask)`` applies to the values of ``x``
        ``(B, n, d_model)``: ``attend`` with ``V = I`` (so CUR's ``C U⁺ R``, not a softmax it approximates). For diagnostics."""
        q, k = (self.split_heads(proj(x)) for proj in (self.q_proj, self.k_proj))
        return self.attend(q, k, self.identity_values(q), key_mask)


class TransformerBlock(nn.Module):
    """``x + Attn(LN(x))`` then ``x + FFN(LN(x))`` (pre-LN, GELU FFN, dropout on both residual branches)."""

    attention_class = MultiHeadAttention  # subclasses swap in their own multi-head wrapper

    def __init__(self, d_model: int, num_heads: int, ffn_dim: int, dropout: float, attention: Callable[..., nn.Module]):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = self.attention_class(d_model, num_heads, attention)
        self.norm2 = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(
            nn.Linear(d_model, ffn_dim), nn.GELU(), Dropout(dropout), nn.Linear(ffn_dim, d_model)
        )
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor, aux_losses: dict[str, torch.Tensor]) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.norm1(x), key_mask))
        return x + self.dropout(self.ffn(self.norm2(x)))
