"""Rows of ``(B, H, n, e)`` tensors: the selected rows the CUR methods and their kernels' autograd formulas gather, and
the token-major layout the kernels write their outputs in (here, below :mod:`attention`, so that both layers call
one function)."""

from __future__ import annotations

import torch


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` ``(B, H, m)`` of ``x`` ``(B, H, n, e)`` -> ``(B, H, m, e)`` (the selected rows of Q, K or C)."""
    return x.gather(2, index[..., None].expand(*index.shape, x.shape[-1]))


def token_major(x: torch.Tensor) -> torch.Tensor:
    """An empty tensor shaped like ``x`` ``(B, H, n, e)`` and laid out ``(B, n, H, e)`` in memory, as SDPA returns its
    output: the heads merge into ``(B, n, H·e)`` as a view."""
    batch, heads, n, e = x.shape
    return x.new_empty(batch, n, heads, e).transpose(1, 2)
