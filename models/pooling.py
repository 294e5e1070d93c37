"""Sequence pooling ``(B, n, d)`` features and ``key_mask`` ``(B, n)`` -> ``(B, d)`` (``model.pooling``).

Both ignore pad rows in the sum; they differ in the divisor:

- :func:`masked_mean` divides by the number of real tokens (a true mean; padding-invariant).
- :func:`padded_mean` divides by a fixed ``padded_length`` (``task.max_length``): the Nyströmformer
  LRA code (``mlpen/Nystromformer`` ``LRA/code/model.py``, ``model_wrapper.py``) zeroes pad rows after the
  final norm and averages over every position of inputs padded to the task's max length, so its
  pooled features shrink with the sequence's length.
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` ``(B, n, d)`` over the real tokens of ``key_mask`` ``(B, n)`` -> ``(B, d)``."""
    weights = key_mask.to(x.dtype).unsqueeze(-1)
    return (x * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def padded_mean(x: torch.Tensor, key_mask: torch.Tensor, padded_length: int) -> torch.Tensor:
    """Sum of ``x`` ``(B, n, d)`` over real tokens divided by ``padded_length`` -> ``(B, d)``.

    Equals ``(x * mask).mean(1)`` over inputs padded to ``padded_length`` (the reference pooling),
    whatever padding a batch actually carries.
    """
    if padded_length < key_mask.shape[-1]:
        raise ValueError(f"padded_mean: padded_length={padded_length} is shorter than the batch ({key_mask.shape[-1]})")
    return (x * key_mask.to(x.dtype).unsqueeze(-1)).sum(1) / padded_length
