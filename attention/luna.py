"""Luna attention (Ma et al., "Luna: Linear Unified Nested Attention", NeurIPS 2021; the paper's "Pack and Unpack
Attention"): the per-head pack and unpack steps. The layer and the extra sequence it carries live in :mod:`models.luna`.

Each layer takes the input ``X`` ``(n, d_model)`` and an extra sequence ``P`` ``(p, d_model)`` (p =
``projection_length``, learned ``P₀`` before the first layer) and returns ``X'`` and ``P'``. Per head h (d = head_dim):

* pack:   ``Y_P^h = softmax(P W_pq^h (X W_pk^h)ᵀ/√d + pad mask) X W_pv^h``      ``(p, d)``
  the heads concatenated, ``Y_P`` ``(p, d_model)``, with no output projection;
* unpack: ``Y_X^h = softmax(X W_q^h (Y_P W_k^h)ᵀ/√d + P mask) Y_P W_v^h``        ``(n, d)``
  then ``W_o`` over the concatenated heads, ``(n, d_model)``.

Cost O(n p d) time per head and O(n d + p d) memory: both products are fused softmax-attention calls
(``F.scaled_dot_product_attention``; on CPU PyTorch's flash kernel), so neither the ``(p, n)`` nor the ``(n, p)``
weights are stored, and the backward recomputes them in blocks.

What follows the authors' code (XuezheMax/fairseq-apollo, ``fairseq/modules/luna_attention.py``,
``LunarMultiheadAttention._compute_pcontext`` and ``forward``; the LRA model in ``fairseq/models/lra/model.py``,
``LRAEncoder.__init__``, and ``fairseq/models/lra/luna_lra_encoder.py``, ``LunaLRAEncoder.forward``):

* separate key and value projections in both steps (the LRA model passes ``tie_kv=False``); the pack keys and
  values are projections of ``X`` (``W_pk``, ``W_pv``), the unpack keys and values projections of ``Y_P``;
* as many pack heads as attention heads (the LRA model passes ``num_projected_attention_heads = heads``), each
  scaled by ``1/√d``; plain softmax in both steps (the softplus in that file is its causal variant's, not used by
  the bidirectional encoder); the same attention dropout on both weight matrices;
* pads are masked as keys of the pack, so ``Y_P`` is a function of the real tokens only;
* dynamic projection (``dynamic_projection``, the encoder's default there, which the LRA model keeps): a sequence
  of ℓ real tokens uses the first ``min(p, ℓ)`` rows of ``P``; the others are masked as keys of the unpack
  (:meth:`LunaAttention.projection_mask`). The authors also cut ``P`` to the batch's ``max ℓ`` rows, which changes
  no result (a masked row never reaches another row); we cut it to ``min(p, n)`` rows, n the padded length (a shape,
  so no host sync): rows past n are masked for every sequence (:meth:`LunaAttention.rows`).

Appending pads changes no real token's output: the pack reads real keys only and ``min(p, ℓ)`` counts real tokens.
A sequence with no real token has no key in either step (its outputs are undefined, as in softmax attention).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attention.config_checks import check_dropout, check_positive_int


class LunaAttention(nn.Module):
    """Luna's pack and unpack for ``num_heads`` heads of ``head_dim``, and the ``P`` settings the model reads.

    ``pack(q, k, v, key_mask)``: ``q`` ``(B, H, p, d)`` from ``P``, ``k, v`` ``(B, H, n, d)`` from ``X``,
    ``key_mask`` bool ``(B, n)`` -> ``Y_P`` per head ``(B, H, p, d)``.
    ``unpack(q, k, v, projection_mask)``: ``q`` ``(B, H, n, d)`` from ``X``, ``k, v`` ``(B, H, p, d)`` from ``Y_P``,
    ``projection_mask`` bool ``(B, p)`` -> ``Y_X`` per head ``(B, H, n, d)``.
    ``projection_length`` is the p that :mod:`models.luna` allocates for ``P₀``.
    """

    # Luna's token mixing softmax(Q K_Pᵀ) (Y_P W_v), Y_P the concatenated pack heads, mixes every pack head into
    # every unpack head through W_k, W_v: no per-head (n, n) matrix applies to X (MultiHeadAttention.attention_matrix)
    no_attention_matrix = ("attention=luna has no per-head n x n attention matrix (each unpack head reads every pack "
                           "head through k_proj/v_proj): diagnostics that need one do not apply to it")

    def __init__(self, num_heads: int, head_dim: int, projection_length: int = 256, dynamic_projection: bool = True,
                 dropout: float = 0.1):
        super().__init__()
        check_positive_int(projection_length, "projection_length")
        if not isinstance(dynamic_projection, bool):
            raise ValueError(f"attention.dynamic_projection must be true or false, got {dynamic_projection!r}")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.projection_length = projection_length
        self.dynamic_projection = dynamic_projection
        self.dropout = check_dropout(dropout)

    def rows(self, n: int) -> int:
        """How many rows of ``P`` a batch padded to n tokens carries: ``min(p, n)`` with dynamic projection (no
        sequence uses more), else p."""
        return min(self.projection_length, n) if self.dynamic_projection else self.projection_length

    def split_rows(self, total: int) -> tuple[int, int]:
        """``(rows of P, n)`` of a ``[P; X]`` of ``total`` rows (inverse of ``rows(n) + n``): without dynamic
        projection ``(p, total − p)``; with it ``total = min(p, n) + n``, so ``n = total − p`` when ``total ≥ 2p``,
        else ``n = total / 2``."""
        p = self.projection_length
        n = total - p if not self.dynamic_projection or total >= 2 * p else total // 2
        return total - n, n

    def projection_mask(self, key_mask: torch.Tensor) -> torch.Tensor:
        """Which of the ``rows(n)`` rows of ``P`` each sequence uses, bool ``(B, rows(n))`` for ``key_mask``
        ``(B, n)``: the first ``min(p, ℓ)`` (ℓ real tokens) with dynamic projection, else all."""
        rows = torch.arange(self.rows(key_mask.shape[1]), device=key_mask.device)
        if self.dynamic_projection:
            return rows < key_mask.sum(-1, keepdim=True)
        return (rows >= 0).expand(key_mask.shape[0], -1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """Refused: Luna is not a drop-in ``attn(q, k, v, key_mask)``; its layer carries ``P`` (:mod:`models.luna`)."""
        raise ValueError("attention=luna runs in its own layers (model=luna, models.luna.LunaBlock), which carry the "
                         "sequence P between layers: drop the model= override that replaced them")

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``softmax(q kᵀ/√d + mask) v`` with ``mask`` bool ``(B, keys)`` (True = may attend), fused."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :],
                                              dropout_p=self.dropout if self.training else 0.0)

    def pack(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``Y_P = softmax(Q_P K_Xᵀ/√d + pad mask) V_X`` ``(B, H, p, d)`` (module docstring, pack)."""
        return self._attend(q, k, v, key_mask)

    def unpack(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection_mask: torch.Tensor) -> torch.Tensor:
        """``Y_X = softmax(Q_X K_Pᵀ/√d + P mask) V_P`` ``(B, H, n, d)`` (module docstring, unpack)."""
        return self._attend(q, k, v, projection_mask)
