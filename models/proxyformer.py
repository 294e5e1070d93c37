"""Proxyformer encoder (Lee, Lee, Shin, AAAI 2024, Fig. 4): m learned proxy tokens ride as a prefix.

The blocks see ``[P; X]`` ``(B, m + n, d_model)`` with ``key_mask`` ``(B, m + n)`` (proxy rows True);
attention (``attention.proxyformer.ProxyAttention``) gives ``[Y_p; Y_x]``, and out-projection,
residuals and FFN apply to all rows, so each layer's first m output rows are the next layer's P.
Before the first layer the injection module (Eq. 11) mixes the input into P; pooling ignores the
proxy rows. Each layer adds its contrastive loss (Eq. 8) and ``encode`` averages it over layers
(Eq. 9) into ``aux_losses["contrastive"]``.

Parameter names follow ``models.encoder.Encoder`` and ``models.blocks`` (``q_proj, k_proj, v_proj,
out_proj``), so a softmax checkpoint loads with only ``proxies`` and ``*.landmark_proj.*`` initialised.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch
from torch import nn

from attention.proxyformer import ProxyAttention
from models.blocks import MultiHeadAttention, TransformerBlock
from models.encoder import Encoder


class ProxyMultiHeadAttention(MultiHeadAttention):
    """``q_proj, k_proj, v_proj, out_proj`` over the input rows plus ``landmark_proj`` (W_L) over the proxies."""

    def __init__(self, d_model: int, num_heads: int, attention: Callable[..., nn.Module]):
        super().__init__(d_model, num_heads, attention)
        if not isinstance(self.attend, ProxyAttention):
            raise ValueError(
                f"model=proxyformer needs attention=proxyformer, got {type(self.attend).__name__} "
                "(drop the model= override, or pick model=encoder for this attention)"
            )
        self.landmark_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor, aux_losses: dict[str, torch.Tensor]) -> torch.Tensor:
        """``x = [P; X]`` ``(B, m + n, d_model)``, ``key_mask`` ``(B, m + n)`` -> ``(B, m + n, d_model)``."""
        m = self.attend.num_proxies
        proxies, tokens = x.split([m, x.shape[1] - m], dim=1)  # one split: its backward is one cat
        landmarks = self.split_heads(self.landmark_proj(proxies))  # (B, H, m, head_dim)
        q, k, v = self.project(tokens, self.q_proj, self.k_proj, self.v_proj)  # one GEMM
        loss = self.attend.contrastive_loss(landmarks)
        if loss is not None:
            aux_losses["contrastive"] = loss
        y = self.attend(q, k, v, key_mask[:, m:], landmarks)  # (B, H, m + n, head_dim)
        return self.out_proj(y.transpose(1, 2).flatten(2))

    def attention_matrix(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``x = [P; X]``, ``key_mask`` ``(B, m + n)`` -> the effective attention ``K₁ K₂`` ``(B, H, n, n)`` of the
        input rows over the input tokens (``attend`` with ``V = I``); the proxy rows are left out."""
        m = self.attend.num_proxies
        proxies, tokens = x.split([m, x.shape[1] - m], dim=1)
        landmarks = self.split_heads(self.landmark_proj(proxies))
        q, k = self.project(tokens, self.q_proj, self.k_proj)
        return self.attend(q, k, self.identity_values(q), key_mask[:, m:], landmarks)[:, :, m:]


class ProxyBlock(TransformerBlock):
    """Pre-LN block over ``[P; X]``: ``x + Attn(LN(x))`` then ``x + FFN(LN(x))`` on all m + n rows."""

    attention_class = ProxyMultiHeadAttention

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor, aux_losses: dict[str, torch.Tensor]) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.norm1(x), key_mask, aux_losses))
        return x + self.dropout(self.ffn(self.norm2(x)))


class ProxyEncoder(Encoder):
    """:class:`models.encoder.Encoder` with learned proxy tokens ``proxies`` ``(m, d_model)`` as a prefix.

    Decision: proxies are initialised N(0, 1) (the paper does not say; token embeddings start at
    ``model.embedding_init_std``) and get no positional embedding.
    """

    def __init__(self, *args, attention: Callable[..., nn.Module], block, **kwargs):
        super().__init__(*args, attention=attention, block=block, **kwargs)
        first = self.blocks[0]
        if not isinstance(first, ProxyBlock):
            raise ValueError(
                f"models.proxyformer.ProxyEncoder needs model.block=models.proxyformer.ProxyBlock, got {type(first).__name__}"
            )
        self.proxy_attention: ProxyAttention = first.attn.attend
        d_model = self.token_embedding.embedding_dim
        self.proxies = nn.Parameter(torch.randn(self.proxy_attention.num_proxies, d_model))

    def token_states(self, input_ids: torch.Tensor, key_mask: torch.Tensor, aux_losses: dict) -> torch.Tensor:
        """``(B, n)`` ids and mask -> final states ``(B, n, d_model)`` of the input rows (proxy rows dropped);
        ``encode`` pools them."""
        x = self.embed(input_ids)
        batch, m = x.shape[0], self.proxies.shape[0]
        proxies = self.proxy_attention.inject(self.proxies.expand(batch, -1, -1), x, key_mask)  # (B, m, d)
        h = torch.cat([proxies, x], dim=1)  # (B, m + n, d)
        mask = torch.cat([key_mask.new_ones(batch, m), key_mask], dim=1)
        layer_losses: dict[str, list[torch.Tensor]] = defaultdict(list)
        for block in self.blocks:
            own: dict[str, torch.Tensor] = {}
            h = block(h, mask, own)
            for name, value in own.items():
                layer_losses[name].append(value)
        for name, values in layer_losses.items():
            aux_losses[name] = torch.stack(values).mean()  # Eq. 9: average over layers
        return self.final_norm(h[:, m:])
