"""Plain PyTorch reference of the selection kernels (:mod:`kernels.selection.cpu`); the landmarks' top indices
are checked against the method's PyTorch form (:func:`attention.selection._top`, tests/attention/test_selection.py)."""

from __future__ import annotations

import torch


def abs_row_sums(x: torch.Tensor) -> torch.Tensor:
    """``Σ_e |x_ie|`` ``(B, H, n)`` of ``x`` ``(B, H, n, d)`` in float64."""
    return x.double().abs().sum(-1)
