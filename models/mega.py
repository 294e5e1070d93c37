"""The MEGA block (Ma et al. 2022, §3; facebookresearch/mega ``MovingAverageGatedAttention``; DESIGN §2).

Pre-LayerNorm moving-average gated attention followed by a pre-LayerNorm SiLU FFN. With
``X = LN(x)`` ``(B, n, d_model)``:

    V  = silu(X W_v)                                   (B, n, hidden_dim)
    X' = EMA(X)        (bidirectional, models/ema.py)   (B, n, d_model)
    u, z, r, hx = split(X' W_mx):  u = σ(·) (update gate), z, r = silu(·) (z_dim, hidden_dim)
    Q = z·γ₀ + β₀,  K = z·γ₁ + β₁                       (B, n, z_dim)
    O  = attn(Q, K, V)     single head, relative bias, softmax or laplace, exact or CUR
    h  = silu(hx + W_h(O ⊙ r))
    y  = x + u ⊙ (h − x)          then  y + FFN(LN(y))

Chunking (``chunk_size`` c, MEGA-chunk): the sequence is padded to a multiple of c and attention
runs inside each chunk (positions restart at 0 in each chunk), cost O(n c); the EMA still spans
the whole sequence. With c ≥ n it equals unchunked attention. ``chunk_size: null`` = one chunk.

Decisions: one dropout rate (``model.dropout``) on the EMA output, on ``h`` and in the FFN, no
attention or hidden dropout (MEGA's LRA runs set those to 0); LayerNorm for every task
(MEGA uses ScaleNorm for Text and BatchNorm for Image/Pathfinder). The block is single-head:
``model.num_heads`` must be 1. Initialisation follows the reference code (N(0, 0.02²) weights,
zero biases, γ ~ N(0, 0.02²), β = 0).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from attention import build_attention
from models.ema import BidirectionalEMA


class MegaBlock(nn.Module):
    """``block(x (B, n, d_model), key_mask (B, n), aux_losses) -> (B, n, d_model)`` (adds no aux loss)."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        ffn_dim: int,
        dropout: float,
        attention: DictConfig,
        z_dim: int = 32,
        hidden_dim: int = 128,
        ndim: int = 16,
        chunk_size: int | None = None,
    ):
        super().__init__()
        if num_heads != 1:
            raise ValueError(f"the MEGA block is single-head: set model.num_heads=1 (got {num_heads})")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"model.block.chunk_size must be null (no chunking) or >= 1, got {chunk_size}")
        self.d_model, self.z_dim, self.hidden_dim, self.chunk_size = d_model, z_dim, hidden_dim, chunk_size
        self.norm = nn.LayerNorm(d_model)
        self.ema = BidirectionalEMA(d_model, ndim)
        self.v_proj = nn.Linear(d_model, hidden_dim)
        self.mx_proj = nn.Linear(d_model, 2 * d_model + z_dim + hidden_dim)
        self.h_proj = nn.Linear(hidden_dim, d_model)
        self.qk_gamma = nn.Parameter(torch.randn(2, z_dim) * 0.02)
        self.qk_beta = nn.Parameter(torch.zeros(2, z_dim))
        self.attend = build_attention(attention, num_heads=1, head_dim=z_dim)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, ffn_dim), nn.SiLU(), nn.Dropout(dropout), nn.Linear(ffn_dim, d_model))
        self.dropout = nn.Dropout(dropout)
        for linear in (self.v_proj, self.mx_proj, self.h_proj):
            nn.init.normal_(linear.weight, std=0.02)
            nn.init.zeros_(linear.bias)

    def chunked_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``q, k (B, n, z_dim)``, ``v (B, n, hidden_dim)`` -> ``(B, n, hidden_dim)``, per chunk of ``chunk_size``."""
        batch, n = key_mask.shape
        c = n if self.chunk_size is None else self.chunk_size
        pad = -n % c
        if pad:
            q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
            key_mask = F.pad(key_mask, (0, pad), value=False)
        chunks = (n + pad) // c
        q, k, v = (t.reshape(batch * chunks, 1, c, t.shape[-1]) for t in (q, k, v))  # (B·K, 1, c, ·)
        out = self.attend(q, k, v, key_mask.reshape(batch * chunks, c))
        return out.reshape(batch, chunks * c, -1)[:, :n]

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor, aux_losses: dict[str, torch.Tensor]) -> torch.Tensor:
        residual = x
        x = self.norm(x)
        v = F.silu(self.v_proj(x))
        mx = self.dropout(self.ema(x, key_mask))
        u, zr, hx = torch.split(self.mx_proj(mx), [self.d_model, self.z_dim + self.hidden_dim, self.d_model], dim=-1)
        u = torch.sigmoid(u)
        z, r = torch.split(F.silu(zr), [self.z_dim, self.hidden_dim], dim=-1)
        q, k = (z.unsqueeze(-2) * self.qk_gamma + self.qk_beta).unbind(-2)  # (B, n, z_dim) each
        attended = self.chunked_attention(q, k, v, key_mask)
        h = self.dropout(F.silu(hx + self.h_proj(attended * r)))
        y = residual + u * (h - residual)
        return y + self.dropout(self.ffn(self.ffn_norm(y)))
