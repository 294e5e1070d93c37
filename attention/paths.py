"""What the landmark attention's forms share: the masked score, the additive mask, constants made once, and the
product with its rows (:func:`product_and_rows`).

Which form runs (the CPU forms with the C++ kernels, plain PyTorch, or the ``fused`` forms of other devices: the
landmark stages as batched GEMMs split over ``n`` in the inputs' dtype, :mod:`attention.landmark_stages`, selection
by sorting chunks of ``n``, no host synchronisation, every other step one batched operator) is ``attention.impl``'s
choice, made in one table: :mod:`attention.impl`. Every kernel of the fused forms whose work grows with ``n`` runs at
least two waves of programs on a 132-SM GPU, and none is an attention kernel given ``m`` queries or keys (which would
run ``B·H`` programs that each walk ``n``).
"""

from __future__ import annotations

import torch


def masked_value(dtype: torch.dtype) -> float:
    """The score of a masked position in ``dtype``: half its lowest value (exp gives exactly 0 beside any score, and a
    row with no key to attend stays finite)."""
    return torch.finfo(dtype).min / 2


MASKED = masked_value(torch.float32)  # the additive mask of a masked key


def masking_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask of a boolean ``mask`` (True = attend) in ``dtype``: 0, or :data:`MASKED` (half float32's
    lowest value, not −inf: a row with no key to attend, a sequence without real tokens, stays finite on every
    attention backend)."""
    return torch.where(mask, 0.0, MASKED).to(dtype)


_CONSTANTS: dict[tuple, torch.Tensor] = {}


def _constant(key: tuple, make) -> torch.Tensor:
    """``make()``, made once per ``key`` in eager code (a constant, not a launch per call); under ``torch.compile``
    made in the graph (a plain dict, not ``functools.lru_cache``, which Dynamo warns about and cannot trace)."""
    if torch.compiler.is_compiling():
        return make()
    if key not in _CONSTANTS:
        _CONSTANTS[key] = make()
    return _CONSTANTS[key]


def positions(m: int, device: torch.device) -> torch.Tensor:
    """``0, 1, …, m − 1`` (int64) on ``device``, made once (:func:`_constant`)."""
    return _constant(("positions", m, device), lambda: torch.arange(m, device=device))


def chunk_starts(chunks: int, length: int, device: torch.device) -> torch.Tensor:
    """``0, L, 2L, …`` (int64, ``(chunks, 1)``) on ``device``: the first positions of ``chunks`` chunks of ``length``
    (``L``), made once (:func:`_constant`)."""
    return _constant(("chunk_starts", chunks, length, device),
                     lambda: torch.arange(0, chunks * length, length, device=device)[:, None])


def identity(m: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The ``m × m`` identity in ``dtype`` on ``device``, made once (:func:`_constant`)."""
    return _constant(("identity", m, dtype, device), lambda: torch.eye(m, dtype=dtype, device=device))


class _ProductAndRows(torch.autograd.Function):
    """``(W, RV) = (P RV, RV)`` for ``P`` ``(B, H, m, m)`` and ``RV`` ``(B, H, m, d)``: one node, so the backward adds
    ``Pᵀ dW`` to the gradient that the rows' other use (CUR's row overwrite ``Y[I] = RV``) gives ``RV``, in one
    ``baddbmm``, and ``dP = dW RVᵀ``."""

    @staticmethod
    def forward(ctx, p: torch.Tensor, rv: torch.Tensor):
        rv_rows = rv.contiguous()  # once: the product needs (B·H, m, d) rows (an attention kernel's output is not)
        ctx.save_for_backward(p, rv_rows)
        ctx.set_materialize_grads(False)  # RV's second use may be none: no zeros made for its gradient
        return p @ rv_rows, rv.view_as(rv)

    @staticmethod
    def backward(ctx, grad_w: torch.Tensor, grad_rv: torch.Tensor | None):
        p, rv = ctx.saved_tensors
        batch, heads, m, d = rv.shape
        if grad_w is None:
            return None, grad_rv
        grad_w = grad_w.contiguous().view(-1, m, d)
        grad_p = (grad_w @ rv.view(-1, m, d).mT).view(p.shape) if ctx.needs_input_grad[0] else None
        p_t = p.reshape(-1, m, m).mT
        rows = p_t @ grad_w if grad_rv is None else torch.baddbmm(grad_rv.reshape(-1, m, d), p_t, grad_w)
        return grad_p, rows.view(batch, heads, m, d)


def product_and_rows(p: torch.Tensor, rv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P @ RV, RV)`` through :class:`_ProductAndRows` when autograd records them (see there)."""
    if torch.is_grad_enabled() and (p.requires_grad or rv.requires_grad):
        return _ProductAndRows.apply(p, rv)
    return p @ rv, rv
