"""The LRA classifier: embeddings -> blocks -> masked mean pooling -> head (docs/design.md §3 "The encoder").

Inputs are ``input_ids`` long ``(B, n)`` and ``key_mask`` bool ``(B, n)``; tasks with several
documents per example (Retrieval) pass ``(B, k, n)``: each document is encoded by the same
encoder and the head receives pooled features ``(B, k, d_model)``.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from models.dropout import Dropout
from models.pooling import masked_mean
from models.positions import LearnedPositions


class Encoder(nn.Module):
    """Token embedding + positions, ``num_layers`` blocks, final LayerNorm, pooling, head.

    ``block``, ``head`` and ``attention`` are factories (Hydra ``_partial_`` configs, built by
    ``lra.build.build_model``); ``attention(num_heads=, head_dim=)`` builds one attention module and is
    handed to every block. ``forward`` returns ``(logits, aux_losses)``.
    ``embedding_init_std``: token and position embeddings start N(0, std²) (the reference LRA code's
    0.02); ``None`` keeps PyTorch's N(0, 1). ``positions(max_length=, d_model=)`` builds the position
    information (:mod:`models.positions`: learned, sinusoidal, rotary or none), kept as
    ``position_embedding``: it adds absolute positions to the embeddings and may wrap the attention
    factory (rotary). ``pooling(x, key_mask) -> (B, d)`` (models/pooling.py).
    ``final_norm(d_model)`` builds the norm before pooling (MEGA's post-norm encoders: ``nn.Identity``).
    """

    def __init__(
        self,
        vocab_size: int,
        max_length: int,
        num_classes: int,
        attention: Callable[..., nn.Module],
        block: Callable[..., nn.Module],
        head: Callable[..., nn.Module],
        d_model: int = 64,
        num_heads: int = 2,
        num_layers: int = 2,
        ffn_dim: int = 128,
        dropout: float = 0.1,
        embedding_init_std: float | None = 0.02,
        positions: Callable[..., nn.Module] = LearnedPositions,
        pooling: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = masked_mean,
        final_norm: Callable[[int], nn.Module] = nn.LayerNorm,
    ):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = positions(max_length=max_length, d_model=d_model)
        if embedding_init_std is not None:
            for embedding in (self.token_embedding, self.position_embedding):
                if isinstance(embedding, nn.Embedding):
                    nn.init.normal_(embedding.weight, std=embedding_init_std)
        attention = self.position_embedding.wrap(attention)
        self.embedding_dropout = Dropout(dropout)
        self.blocks = nn.ModuleList(
            block(d_model=d_model, num_heads=num_heads, ffn_dim=ffn_dim, dropout=dropout, attention=attention)
            for _ in range(num_layers)
        )
        self.final_norm = final_norm(d_model)
        self.head = head(d_model=d_model, num_classes=num_classes)
        self.max_length = max_length
        self.pool = pooling

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``(B, n)`` ids -> token + position embeddings ``(B, n, d_model)`` (after dropout)."""
        n = input_ids.shape[-1]
        if n > self.max_length:
            raise ValueError(f"sequence of {n} tokens exceeds the model's max_length={self.max_length} (task.max_length)")
        return self.embedding_dropout(self.position_embedding.add(self.token_embedding(input_ids)))

    def token_states(self, input_ids: torch.Tensor, key_mask: torch.Tensor, aux_losses: dict) -> torch.Tensor:
        """``(B, n)`` ids and mask -> per-token final states ``(B, n, d_model)`` (after the final norm, before
        pooling): what self-pretraining's per-position decoder reads (``lra.pretrain``)."""
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, key_mask, aux_losses)
        return self.final_norm(x)

    def encode(self, input_ids: torch.Tensor, key_mask: torch.Tensor, aux_losses: dict) -> torch.Tensor:
        """``(B, n)`` ids and mask -> pooled features ``(B, d_model)``."""
        return self.pool(self.token_states(input_ids, key_mask, aux_losses), key_mask)

    def forward(self, input_ids: torch.Tensor, key_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        aux_losses: dict[str, torch.Tensor] = {}
        leading = input_ids.shape[:-1]  # (B,) or (B, k) for multi-document tasks
        features = self.encode(input_ids.flatten(0, -2), key_mask.flatten(0, -2), aux_losses)
        return self.head(features.unflatten(0, leading)), aux_losses
