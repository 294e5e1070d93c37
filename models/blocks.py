"""Pre-LayerNorm Transformer block and the multi-head wrapper that owns the projections.

Block contract (every block, including MEGA's): ``block(x, key_mask, aux_losses) -> x`` with
``x`` ``(B, n, d_model)``, ``key_mask`` bool ``(B, n)`` (True = real token); a block may add
named scalar losses to ``aux_losses``, which the LightningModule sums into the loss and logs.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from models.dropout import Dropout


class MultiHeadAttention(nn.Module):
    """Projections ``q_proj, k_proj, v_proj, out_proj`` around a drop-in variant ``attend``.

    The projection names and shapes are the same for every variant, so a checkpoint trained with
    one variant loads into another (direct weight transfer). ``attention(num_heads=, head_dim=)`` builds
    the variant (a factory: ``lra.build.attention_factory`` of the attention config).

    ``q, k, v`` come from one GEMM (:meth:`project`): ``x`` ``(B, n, d_model)`` times the three weights
    concatenated, ``(3·d_model, d_model)`` (a copy of 3·d_model² values per call beside B·n·3·d_model²
    multiply-adds), one launch reading ``x`` once where three did; ``q, k, v`` are views of the one
    ``(B, n, 3·d_model)`` product. The three ``nn.Linear`` stay, under their names: checkpoints keep the keys
    ``q_proj.weight …``, and LoRA (``lra.finetune``, peft) finds and wraps them by name. A wrapped projection
    (peft's ``lora.Linear``: base layer plus adapters) or one with hooks is called as a module, one by one: one
    GEMM over the base weights would skip its adapters and hooks.
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

    def project(self, x: torch.Tensor, *projections: nn.Module) -> list[torch.Tensor]:
        """``split_heads(p(x))`` ``(B, H, n, head_dim)`` for each of ``projections`` (e.g. ``q_proj, k_proj, v_proj``)
        of ``x`` ``(B, n, d_model)``: one GEMM over their concatenated weights when every one is a plain
        ``nn.Linear`` without hooks, else each module called (a LoRA-wrapped projection runs its adapters)."""
        plain = all(type(p) is nn.Linear and not (p._forward_hooks or p._forward_pre_hooks) for p in projections)
        biases = [p.bias for p in projections] if plain else []
        if plain and (all(b is not None for b in biases) or all(b is None for b in biases)):
            bias = torch.cat(biases) if biases[0] is not None else None
            out = F.linear(x, torch.cat([p.weight for p in projections]), bias)  # (B, n, Σ out_features)
            return [self.split_heads(y) for y in out.split([p.out_features for p in projections], -1)]
        return [self.split_heads(p(x)) for p in projections]

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x, self.q_proj, self.k_proj, self.v_proj)
        y = self.attend(q, k, v, key_mask)  # (B, H, n, head_dim)
        return self.out_proj(y.transpose(1, 2).flatten(2))

    def identity_values(self, q: torch.Tensor) -> torch.Tensor:
        """``V = I`` ``(B, H, n, n)`` for queries ``q`` ``(B, H, n, ·)``: ``attend(q, k, V)`` is then the attention
        matrix itself (what :meth:`attention_matrix` returns)."""
        batch, heads, n, _ = q.shape
        return torch.eye(n, dtype=q.dtype, device=q.device).expand(batch, heads, n, n).contiguous()

    def attention_matrix(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """The effective attention ``(B, H, n, n)`` that ``forward(x, key_mask)`` applies to the values of ``x``
        ``(B, n, d_model)``: ``attend`` with ``V = I`` (so CUR's ``C U⁺ R``, not a softmax it approximates). For diagnostics.
        A variant whose output is no per-head linear map of ``V`` says why in ``no_attention_matrix`` (Luna, DBA, Set
        Transformer): a ValueError with that reason."""
        reason = getattr(self.attend, "no_attention_matrix", None)
        if reason:
            raise ValueError(reason)
        q, k = self.project(x, self.q_proj, self.k_proj)
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
