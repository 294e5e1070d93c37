"""Sparse Transformer attention patterns (Child et al. 2019, "Generating Long Sequences with Sparse Transformers",
§4.3), as the Long Range Arena runs them (google-research/long-range-arena ``lra_benchmarks/models/
sparse_transformer/sparse_attention.py``; its ``train_utils.py`` builds every LRA Sparse Transformer with
``Fixed1Pattern(block_size=50)`` and ``Fixed2Pattern(block_size=50, c=10)``).

Each query i attends, by ordinary softmax ``softmax(q Kᵀ/√d + M) V``, to the union of two index sets (the two
factorised heads merged into one pattern, as LRA's ``build_mask``), intersected with ``j ≤ i`` when ``causal``:

* ``fixed`` (§4.3, "fixed attention"): ``A⁽¹⁾ = {j : ⌊j/l⌋ = ⌊i/l⌋}`` (same block of l) and
  ``A⁽²⁾ = {j : j mod l = 0 or j mod l ≥ l − c}`` (the "summary" columns: the paper's ``j mod l ∈ {t, …, l}``,
  ``t = l − c``, where ``l ≡ 0``).
* ``strided`` (§4.3, "strided attention"): ``A⁽¹⁾ = {j : i − l < j ≤ i}`` (LRA's ``LocalPattern(bandwidth=l)``;
  the paper writes ``{max(0, i − l), …, i}``, one more) — made symmetric, ``|i − j| < l``, when not causal —
  and ``A⁽²⁾ = {j : (i − j) mod l = 0}``.

``causal: true`` is LRA's choice ("All Sparse Transformer attention patterns (both encoder and decoder) are
causal"), which is kept for the table's row: every token of the encoder sees only earlier ones (the LRA ListOps
score of this row, 17.07, is below chance). LRA's encoder also lets a prepended CLS token attend to and be
attended by every token; our encoder pools without a CLS token, so there is no such row or column here.

Computed as LRA does: the dense ``(B, H, n, n)`` scores with the pattern as a mask (built from ``arange`` on the
inputs' device at each call: no host sync, one graph). Cost O(n² d) time, O(n²) memory, like softmax: the
pattern changes the maths, not the cost (Child et al.'s block-sparse kernels are GPU-only and not in LRA).

Padding: the pattern depends on absolute positions only, not on n, and pad keys are masked, so appending pads
leaves real outputs unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attention.config_checks import check_choice, check_dropout, check_positive_int

PATTERNS = ("fixed", "strided")


def sparse_pattern(n: int, pattern: str, block_size: int, c: int, causal: bool, device=None) -> torch.Tensor:
    """Bool ``(n, n)``: True where query i may attend to key j."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    if pattern == "fixed":
        remainder = j % block_size
        allowed = (i // block_size == j // block_size) | (remainder == 0) | (remainder >= block_size - c)
    else:
        allowed = ((i - j).abs() < block_size) | ((i - j) % block_size == 0)
    return allowed & (j <= i) if causal else allowed


class SparseTransformerAttention(nn.Module):
    """Softmax attention restricted to a Sparse Transformer pattern (see the module docstring)."""

    def __init__(self, num_heads: int, head_dim: int, pattern: str = "fixed", block_size: int = 50, c: int = 10,
                 causal: bool = True, dropout: float = 0.1):
        super().__init__()
        self.head_dim = head_dim
        self.pattern = check_choice(pattern, PATTERNS, "pattern")
        self.block_size = check_positive_int(block_size, "block_size")
        self.c = check_positive_int(c, "c")
        if c > block_size:
            raise ValueError(f"attention.c must be <= attention.block_size ({block_size}): it counts the summary "
                             f"columns at the end of each block, got {c}")
        self.causal = causal
        self.dropout = check_dropout(dropout)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        n = q.shape[-2]
        allowed = sparse_pattern(n, self.pattern, self.block_size, self.c, self.causal, q.device)
        allowed = allowed & key_mask[:, None, None, :]  # (B, 1, n, n)
        scores = (q @ k.transpose(-1, -2)) * self.head_dim**-0.5
        # a finite floor, not -inf: a pad query with no allowed real key gets finite weights instead of NaN
        weights = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min).softmax(-1)
        return F.dropout(weights, self.dropout, self.training) @ v
