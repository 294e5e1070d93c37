"""Which form of the landmark attention a tensor runs: the CPU forms or the fused forms of other devices.

* CPU tensors run the CPU forms: the compiled kernels of the ``*_cpu`` modules where they apply, else PyTorch code
  tuned for the CPU (in-place softmax, ``n × m`` products), unchanged by the fused forms.
* Every other device (CUDA; ``meta``, where ``lra.bench launches`` counts a GPU's kernels and
  ``tests/test_device_hygiene.py`` looks for host syncs) runs the fused forms: each landmark stage one
  ``F.scaled_dot_product_attention`` call (its memory-efficient kernel on a GPU), selection by sorting, no host
  synchronisation and no tensor made on the host, every other step one batched operator. On a GPU the time of an
  attention layer of LRA's size is kernel launches, not arithmetic: the fused forms launch a few dozen kernels
  for one layer's forward and backward where the CPU forms' PyTorch code launches a few hundred.

``FUSED_ON_CPU = True`` runs the fused forms on CPU tensors too: the tests check them against the dense
references there.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

FUSED_ON_CPU = False


def fused(x: torch.Tensor) -> bool:
    """Whether ``x``'s landmark attention runs the fused forms (any device but the CPU, or :data:`FUSED_ON_CPU`)."""
    return FUSED_ON_CPU or x.device.type != "cpu"


MASKED = torch.finfo(torch.float32).min / 2  # the additive mask of a masked key (exp gives exactly 0 beside any score)


def masking_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask of a boolean ``mask`` (True = attend) in ``dtype``: 0, or :data:`MASKED` (half float32's
    lowest value, not −inf: a row with no key to attend, a sequence without real tokens, stays finite on every
    attention backend)."""
    return torch.where(mask, 0.0, MASKED).to(dtype)


@functools.lru_cache(maxsize=None)
def positions(m: int, device: torch.device) -> torch.Tensor:
    """``0, 1, …, m − 1`` (int64) on ``device``, made once: a constant, not a launch per call."""
    return torch.arange(m, device=device)


@functools.lru_cache(maxsize=None)
def identity(m: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(I_m, its additive mask)``: the ``m × m`` identity, and the bias that lets row ``i`` attend to key ``i`` only
    (0 on the diagonal, :func:`masking_bias` elsewhere). Made once per size, dtype and device: constants, not a
    launch per call."""
    eye = torch.eye(m, dtype=dtype, device=device)
    return eye, masking_bias(eye.bool(), dtype)


def attention_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``softmax(q kᵀ / √d + mask)`` itself, ``(B, H, a, b)`` for ``q`` ``(B, H, a, d)``, ``k`` ``(B, H, b, d)`` and an
    additive ``mask`` broadcasting to ``(B, H, a, b)``, by one fused attention call with the identity as values (the
    weights times ``I``). Heads ride in the batch (``(B·H, 1, ·, ·)``, free for contiguous operands), so the result is
    contiguous: an attention kernel writes its output as ``(B, a, H, ·)``, which the pseudo-inverse would copy."""
    batch, heads, a, _ = q.shape
    b = k.shape[-2]

    def fold(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(batch * heads, 1, *x.shape[-2:])

    eye = identity(b, q.dtype, q.device)[0].expand(batch * heads, 1, b, b)
    weights = F.scaled_dot_product_attention(fold(q), fold(k), eye, attn_mask=fold(mask.expand(batch, heads, a, b)))
    return weights.view(batch, heads, a, b)


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
