"""Selected rows of a ``(B, H, n, e)`` tensor, what the CUR methods and their kernels' autograd formulas gather (here,
below :mod:`attention`, so that both layers call one function)."""

from __future__ import annotations

import torch


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` ``(B, H, m)`` of ``x`` ``(B, H, n, e)`` -> ``(B, H, m, e)`` (the selected rows of Q, K or C)."""
    return x.gather(2, index[..., None].expand(*index.shape, x.shape[-1]))
