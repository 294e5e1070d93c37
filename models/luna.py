"""Luna encoder (Ma et al. 2021; docs/design.md §3 "The encoder"): the extra sequence ``P`` rides as a prefix.

The blocks see ``[P; X]`` ``(B, r + n, d_model)`` with the mask ``[P mask; key_mask]`` ``(B, r + n)`` (r =
``LunaAttention.rows(n)``: p, or ``min(p, n)`` with dynamic projection; the P mask from ``projection_mask``), so the block contract (``block(x, key_mask, aux_losses) -> x``) and the
encoder loop stay those of :mod:`models.encoder`, as with Proxyformer's prefix. One Luna layer, with ``Y_X, Y_P`` the
unpack and pack outputs of :mod:`attention.luna` and ``drop`` the model dropout (the paper's "Luna Layers", post-LayerNorm)::

    X_A = LN₁(X + drop(Y_X))       P' = LN_P(P + drop(Y_P))       X' = LN₂(X_A + drop(FFN(X_A)))

so the next layer gets ``P' = P_A``, the normalised residual sum (no FFN on ``P``), as the paper's P' = P_A and the
authors' code (XuezheMax/fairseq-apollo ``fairseq/modules/luna_sentence_encoder.py``,
``LunaSentenceEncoderLayer.forward``). Following their LRA encoder (``fairseq/models/lra/luna_lra_encoder.py``,
``LunaLRAEncoder.forward``, built by ``fairseq/models/lra/model.py`` ``LRAEncoder`` with ``normalize_before=False``
and ``layernorm_embedding`` on for every LRA task): the layers are post-norm, the token embeddings (with positions)
and ``P₀`` each pass a LayerNorm and then the embedding dropout, and there is no final norm before pooling
(``configs/model/luna.yaml``: ``final_norm`` is the identity). ``P₀`` starts N(0, ``embedding_init_std``²) (their
``--apply-bert-init``, on by default in the LRA model: N(0, 0.02²)); N(0, 1/d_model) when ``embedding_init_std`` is
null (their init without it). Positions (``model/positions``) are added to ``X`` only: the authors' LRA model has
sinusoidal positions (``encoder_learned_pos`` off) and adds them, with both embeddings scaled by √d_model, to ``P₀``
too; ``P₀`` being learned, a fixed offset and scale of it only change where its training starts.

Decisions: the linear layers keep PyTorch's initialisation, as every other block here (the authors' N(0, 0.02²)
BERT init is not applied), and the FFN is this project's (GELU, as the authors' LRA default ``activation_fn``).

Parameter names follow :mod:`models.blocks` (``q_proj, k_proj, v_proj, out_proj`` for the unpack, ``norm1``,
``norm2``, ``ffn``), so a softmax checkpoint loads with only Luna's own kinds initialised: the pack projections
``pq_proj, pk_proj, pv_proj``, the blocks' ``projection_norm``, and the encoder's ``projections`` (``P₀``),
``embedding_norm`` and ``projection_norm``.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from attention.luna import LunaAttention
from models.blocks import MultiHeadAttention, TransformerBlock
from models.encoder import Encoder


class LunaMultiHeadAttention(MultiHeadAttention):
    """Pack projections ``pq_proj`` (of ``P``), ``pk_proj, pv_proj`` (of ``X``); unpack ``q_proj`` (of ``X``),
    ``k_proj, v_proj`` (of ``Y_P``) and ``out_proj``."""

    def __init__(self, d_model: int, num_heads: int, attention: Callable[..., nn.Module]):
        super().__init__(d_model, num_heads, attention)
        if not isinstance(self.attend, LunaAttention):
            raise ValueError(f"model=luna needs attention=luna, got {type(self.attend).__name__} "
                             "(drop the model= override, or pick model=encoder for this attention)")
        self.pq_proj = nn.Linear(d_model, d_model)
        self.pk_proj = nn.Linear(d_model, d_model)
        self.pv_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, projected: torch.Tensor, key_mask: torch.Tensor,
                projection_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``(B, n, d_model)``, ``projected`` (``P``) ``(B, p, d_model)``, masks ``(B, n)``, ``(B, p)`` ->
        ``(W_o Y_X, Y_P)``, ``(B, n, d_model)`` and ``(B, p, d_model)``."""
        q, pk, pv = self.project(x, self.q_proj, self.pk_proj, self.pv_proj)  # one GEMM over X
        packed = self.attend.pack(self.split_heads(self.pq_proj(projected)), pk, pv, key_mask)  # (B, H, p, d)
        packed = packed.transpose(1, 2).flatten(2)  # (B, p, d_model): Y_P, heads concatenated
        k, v = self.project(packed, self.k_proj, self.v_proj)
        y = self.attend.unpack(q, k, v, projection_mask)  # (B, H, n, d)
        return self.out_proj(y.transpose(1, 2).flatten(2)), packed


class LunaBlock(TransformerBlock):
    """One Luna layer over ``[P; X]`` (module docstring): post-norm, P updated by the pack, X by unpack and FFN."""

    attention_class = LunaMultiHeadAttention

    def __init__(self, d_model: int, num_heads: int, ffn_dim: int, dropout: float, attention: Callable[..., nn.Module]):
        super().__init__(d_model, num_heads, ffn_dim, dropout, attention)
        self.projection_norm = nn.LayerNorm(d_model)

    def forward(self, h: torch.Tensor, mask: torch.Tensor, aux_losses: dict[str, torch.Tensor]) -> torch.Tensor:
        """``h = [P; X]`` ``(B, r + n, d_model)``, ``mask`` ``(B, r + n)`` -> ``[P'; X']`` (r rows of P:
        ``LunaAttention.rows(n)``)."""
        rows = self.attn.attend.split_rows(h.shape[1])  # (rows of P, n)
        projected, x = h.split(rows, dim=1)
        projection_mask, key_mask = mask.split(rows, dim=1)
        y, packed = self.attn(x, projected, key_mask, projection_mask)
        x = self.norm1(x + self.dropout(y))
        projected = self.projection_norm(projected + self.dropout(packed))
        x = self.norm2(x + self.dropout(self.ffn(x)))
        return torch.cat([projected, x], dim=1)


class LunaEncoder(Encoder):
    """:class:`models.encoder.Encoder` with Luna's ``P₀`` ``projections`` ``(p, d_model)`` as a prefix and the
    authors' LRA embedding norms (module docstring)."""

    def __init__(self, *args, attention: Callable[..., nn.Module], block, embedding_init_std: float | None = 0.02,
                 **kwargs):
        super().__init__(*args, attention=attention, block=block, embedding_init_std=embedding_init_std, **kwargs)
        first = self.blocks[0]
        if not isinstance(first, LunaBlock):
            raise ValueError(f"models.luna.LunaEncoder needs model.block=models.luna.LunaBlock, got {type(first).__name__}")
        self.luna_attention: LunaAttention = first.attn.attend
        d_model = self.token_embedding.embedding_dim
        std = d_model**-0.5 if embedding_init_std is None else embedding_init_std
        self.projections = nn.Parameter(torch.randn(self.luna_attention.projection_length, d_model) * std)
        self.embedding_norm = nn.LayerNorm(d_model)
        self.projection_norm = nn.LayerNorm(d_model)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``(B, n)`` ids -> ``drop(LN(token + position))`` ``(B, n, d_model)`` (the authors' ``layernorm_embedding``)."""
        n = input_ids.shape[-1]
        if n > self.max_length:
            raise ValueError(f"sequence of {n} tokens exceeds the model's max_length={self.max_length} (task.max_length)")
        x = self.position_embedding.add(self.token_embedding(input_ids))
        return self.embedding_dropout(self.embedding_norm(x))

    def token_states(self, input_ids: torch.Tensor, key_mask: torch.Tensor, aux_losses: dict) -> torch.Tensor:
        """``(B, n)`` ids and mask -> final states ``(B, n, d_model)`` of the input rows (``P`` dropped)."""
        x = self.embed(input_ids)
        batch, r = x.shape[0], self.luna_attention.rows(x.shape[1])  # r = min(projection_length, n) when dynamic
        projected = self.embedding_dropout(self.projection_norm(self.projections)[:r].expand(batch, r, -1))  # row-wise norm
        h = torch.cat([projected, x], dim=1)  # (B, r + n, d)
        mask = torch.cat([self.luna_attention.projection_mask(key_mask), key_mask], dim=1)
        for block in self.blocks:
            h = block(h, mask, aux_losses)
        return self.final_norm(h[:, r:])
