"""MEGA's single-head attention core, exact or CUR-approximated (Ma et al. 2022; CUR paper §6; docs/design.md §2 "MEGA and MegaCUR").

The MEGA block (``models/mega.py``) computes ``Q, K`` (``z_dim``) and ``V`` (``hidden_dim``) and calls
this core as ``attn(q, k, v, key_mask) -> out`` over ``(B, 1, n, ·)`` tensors (one head; one chunk of
the sequence per batch row when the block chunks). The core holds the simple relative position
bias ``b[j − i]`` (a table of ``2·max_positions − 1`` scalars) and an attention function:

* ``Softmax``: ``A = softmax_j(q_i·k_j · z_dim^−½ + b[j − i])`` over real keys (pads masked);
* ``Laplace``: ``A_ij = f(q_i·k_j / n_real + b[j − i])`` with
  ``f(x) = 0.5·(1 + erf((x − √½) / (√(1/4π)·√2)))``, no row normalisation, pad keys zeroed.
  **Decision** (as the reference code): ``n_real`` is the number of real tokens of the sequence
  (of the chunk when chunking), at least 1 — also for the C and R blocks of CUR.

Function and bias together form a score function with the contract of :mod:`attention.scores`
(``score(q, k, key_mask, q_index, k_index) -> weights``; the indices place rows in the sequence,
which is what the relative bias needs). The approximation is a config object: ``Exact`` forms
``A V`` (O(n²) memory); ``CUR`` selects m rows/columns (:func:`attention.selection.select_indices`)
and forms ``C U⁺ (R V)`` (:func:`attention.cur.cur_attention`) with ``C, R, U`` given by the same
score on the selected pairs, for either function. Both configs (``mega``, ``megacur``) build this
class and the approximations own no parameters, so a MEGA checkpoint loads into MegaCUR with no
parameter skipped (CUR paper Table 3). No attention dropout (MEGA's LRA runs use 0).

**Decision** (config keys): the approximation node is a ``_partial_`` factory and the knobs it takes
sit at the top of the attention node, so MegaCUR's landmark count is ``attention.num_landmarks`` (and
``attention.selection``, ``attention.pinv_iters``, ...) exactly as for ``curformer`` and
``nystromformer``; :class:`MegaAttention` passes every key it does not own to the factory.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch
from torch import nn

from attention import impl
from attention.cur import CURAttention, cur_attention
from attention.scores import masked_softmax


class Softmax(nn.Module):
    """``softmax(q kᵀ · d^−½ + bias)`` over the unmasked keys (``attention.scores.masked_softmax``)."""

    def forward(self, qk, bias, key_mask, n_real, head_dim: int) -> torch.Tensor:
        return masked_softmax(qk * head_dim**-0.5 + bias, key_mask)


class Laplace(nn.Module):
    """Elementwise ``0.5·(1 + erf((x − μ)/(σ√2)))``, ``μ = √½``, ``σ = √(1/4π)``, of ``x = q kᵀ / n_real + bias``."""

    mu = math.sqrt(0.5)
    sigma = math.sqrt(1.0 / (4.0 * math.pi))

    def forward(self, qk, bias, key_mask, n_real, head_dim: int) -> torch.Tensor:
        weights = 0.5 * (1.0 + torch.erf((qk / n_real + bias - self.mu) / (self.sigma * math.sqrt(2.0))))
        return weights if key_mask is None else weights * key_mask


class RelativeBiasScore(nn.Module):
    """MEGA score ``function(q kᵀ, b[k_index − q_index])``, contract of :mod:`attention.scores`.

    ``q (B, H, a, d)``, ``k (B, H, b, d)``; ``key_mask`` bool broadcastable to ``(B, H, 1, b)`` or None;
    ``q_index (B, H, a)`` / ``k_index (B, H, b)`` the rows' positions (None = ``arange``); ``n_real``
    ``(B,)`` the sequence's real-token count for Laplace (None = count of ``key_mask``, right when
    the keys are the whole sequence). Returns the weights ``(B, H, a, b)``.
    """

    def __init__(self, head_dim: int, max_positions: int, function: nn.Module):
        super().__init__()
        if max_positions < 1:
            raise ValueError(f"attention.max_positions must be >= 1 (set it to task.max_length), got {max_positions}")
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.function = function
        self.bias = nn.Parameter(torch.randn(2 * max_positions - 1) * 0.02)

    def forward(self, q, k, key_mask=None, q_index=None, k_index=None, n_real=None) -> torch.Tensor:
        a, b = q.shape[-2], k.shape[-2]
        q_pos = torch.arange(a, device=q.device) if q_index is None else q_index
        k_pos = torch.arange(b, device=q.device) if k_index is None else k_index
        # b[j − i] as table row j − i + L − 1: int32 rows and index_select, whose backward is index_add_ (on
        # (32, 1, 2000, 64) rows a quarter of int64 advanced indexing and its sorting index_put_, docs/bench.md)
        offsets = k_pos.int().unsqueeze(-2) - (q_pos.int() - (self.max_positions - 1)).unsqueeze(-1)  # (·, a, b)
        bias = self.bias.to(q.dtype).index_select(0, offsets.flatten()).view(offsets.shape)
        if n_real is None:
            n_real = torch.full((q.shape[0],), b, device=q.device) if key_mask is None else key_mask.sum(-1).flatten(1).amax(-1)
        n_real = n_real.clamp_min(1).to(q.dtype)[:, None, None, None]
        return self.function(q @ k.transpose(-1, -2), bias, key_mask, n_real, self.head_dim)


class Exact(nn.Module):
    """Exact attention ``A V`` with the full ``(B, H, n, n)`` matrix ``A = score(Q, K)``."""

    def forward(self, q, k, v, key_mask, score: RelativeBiasScore) -> torch.Tensor:
        return score(q, k, key_mask[:, None, None, :]) @ v


class CUR(CURAttention):
    """MegaCUR: CUR approximation (CUR paper Alg. 1) of the MEGA attention matrix.

    Selection and ``C U⁺ (R V)`` (+ row overwrite) come from :mod:`attention.selection` and
    :func:`attention.cur.cur_attention`; the score they apply is MEGA's (function + relative bias at
    the selected positions), with Laplace's ``n_real`` fixed to the sequence's real-token count.
    Defaults are the CUR paper's LRA setting (m = 64, ``abs``, same indices, 6 pinv iterations).
    With ``pinv_init: global`` one maximum spans every sequence *and chunk* of the call (:mod:`attention.pinv`).
    Cost O(n m d + m³) instead of O(n² d).
    """

    def __init__(self, **knobs):
        super().__init__(num_heads=1, head_dim=None, **knobs)

    def forward(self, q, k, v, key_mask, score: RelativeBiasScore) -> torch.Tensor:
        forms = impl.forms_for(self, q)  # attention.impl (family cur) on this device and dtype
        index_q, index_k = self.select(q, k, key_mask, forms.selection)
        sequence_score = functools.partial(score, n_real=key_mask.sum(-1))
        return cur_attention(
            q, k, v, key_mask, index_q, index_k, sequence_score, self.pinv_iters, self.overwrite_rows, self.pinv_init,
            forms,
        )


class MegaAttention(nn.Module):
    """MEGA attention core ``attn(q, k, v, key_mask) -> (B, 1, n, d_v)`` = ``approximation(q, k, v, key_mask, score)``.

    ``num_heads`` must be 1 (MEGA's gated attention is single-head); ``head_dim`` is ``z_dim``.
    ``approximation`` is a module, or a factory called with ``approximation_knobs`` (the attention
    node's other keys: ``num_landmarks``, ``selection``, ... for :class:`CUR`; none for :class:`Exact`).
    """

    def __init__(self, num_heads: int, head_dim: int, function: nn.Module, max_positions: int,
                 approximation: Callable[..., nn.Module] | nn.Module, **approximation_knobs):
        super().__init__()
        if num_heads != 1:
            raise ValueError(f"MEGA attention is single-head, built with num_heads={num_heads}: use it with model=mega")
        self.score = RelativeBiasScore(head_dim, max_positions, function)
        if isinstance(approximation, nn.Module):
            if approximation_knobs:
                raise ValueError(
                    f"attention keys {sorted(approximation_knobs)} go to the approximation, which is already built: "
                    "give attention.approximation as a _partial_ factory (see configs/attention/megacur.yaml)"
                )
            self.approximation = approximation
        else:
            self.approximation = approximation(**approximation_knobs)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        n = q.shape[-2]
        if n > self.score.max_positions:
            raise ValueError(
                f"sequence (or chunk) of {n} positions exceeds attention.max_positions={self.score.max_positions}, "
                "the relative-bias table; set attention.max_positions >= task.max_length"
            )
        return self.approximation(q, k, v, key_mask, self.score)

    def attention_matrix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """The effective attention ``(B, 1, n, n)`` that ``forward(q, k, v, key_mask)`` applies to ``v`` (unused): the
        forward with ``V = I``, so MegaCUR's ``C U⁺ R``, not the matrix it approximates. For diagnostics."""
        batch, heads, n, _ = q.shape
        identity = torch.eye(n, dtype=q.dtype, device=q.device).expand(batch, heads, n, n).contiguous()
        return self(q, k, identity, key_mask)
