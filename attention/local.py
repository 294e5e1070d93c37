"""Local attention as the Long Range Arena runs it (Tay et al. 2021, "Long Range Arena", §4: "Local Attention"
baseline; code: google-research/long-range-arena ``lra_benchmarks/models/local/``).

The form: **non-overlapping blocks** (not a sliding window). The sequence is zero-padded to a multiple of
``block_size`` b and cut into n'/b groups of b tokens; each query attends, with ordinary softmax
``softmax(q Kᵀ/√d + M) V``, to the real keys of its own group only. LRA's encoder uses b = 50
(``LocalTransformerEncoder(block_size=50)``), attention dropout 0.1.

``grouping`` says which tokens share a group:

* ``contiguous`` (default): tokens ``[g·b, (g+1)·b)``, the local blocks the LRA paper describes.
* ``strided``: what LRA's code computes, as we read it. ``local_attention.py`` reshapes ``(batch, n', …)`` to
  ``(batch, b, n'/b, …)`` and attends over axis 1, so group g holds tokens ``g, g + n'/b, g + 2n'/b, …``
  (stride n'/b), not a contiguous block. Its padding mask is reshaped the other way round (contiguous
  chunks) and applied to those strided groups; we apply the real key mask instead, so this form is LRA's
  grouping with correct masking, not a bit-exact copy of its numbers.

Shapes: ``q, k, v`` ``(B, H, n, d)``, ``key_mask`` bool ``(B, n)`` -> ``(B, H, n, d)``. Cost O(n b d) time,
O(n b) memory: one ``(B, H, n'/b, b, b)`` batched matmul, no loop over blocks.

Padding: with ``contiguous`` groups, appending pads leaves every real token's output unchanged (its block and
the real keys in it are the same). With ``strided`` groups the stride n'/b depends on the padded length, so
appended pads regroup the tokens: real outputs change, and the test pins only the dense form.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attention.config_checks import check_choice, check_dropout, check_positive_int

GROUPINGS = ("contiguous", "strided")


class LocalAttention(nn.Module):
    """Softmax attention within groups of ``block_size`` tokens (see the module docstring)."""

    def __init__(self, num_heads: int, head_dim: int, block_size: int = 50, grouping: str = "contiguous",
                 dropout: float = 0.1):
        super().__init__()
        self.head_dim = head_dim
        self.block_size = check_positive_int(block_size, "block_size")
        self.grouping = check_choice(grouping, GROUPINGS, "grouping")
        self.dropout = check_dropout(dropout)

    def to_groups(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., n', e)`` -> ``(..., n'/b, b, e)``: group g's b tokens in order."""
        blocks = x.shape[-2] // self.block_size
        if self.grouping == "contiguous":
            return x.unflatten(-2, (blocks, self.block_size))
        return x.unflatten(-2, (self.block_size, blocks)).transpose(-2, -3)

    def from_groups(self, x: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`to_groups`: ``(..., n'/b, b, e)`` -> ``(..., n', e)``."""
        if self.grouping == "strided":
            x = x.transpose(-2, -3)
        return x.flatten(-3, -2)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        n = q.shape[-2]
        pad = (-n) % self.block_size
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        real = F.pad(key_mask, (0, pad), value=False)  # (B, n')
        real = self.to_groups(real[:, None, :, None]).transpose(-1, -2)  # (B, 1, n'/b, 1, b)
        qg, kg, vg = (self.to_groups(x) for x in (q, k, v))  # (B, H, n'/b, b, d)
        scores = (qg @ kg.transpose(-1, -2)) * self.head_dim**-0.5  # (B, H, n'/b, b, b)
        # a finite floor, not -inf: an all-pad group (pad rows only) gets uniform weights instead of NaN
        weights = scores.masked_fill(~real, torch.finfo(scores.dtype).min).softmax(-1)
        weights = F.dropout(weights, self.dropout, self.training)
        return self.from_groups(weights @ vg)[..., :n, :]
