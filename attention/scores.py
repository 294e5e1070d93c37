"""Score functions: the "attention function" half of DESIGN §1's score × approximation.

A score function maps queries and keys to row-normalised attention weights::

    score(q, k, key_mask, q_index=None, k_index=None) -> weights

* ``q`` ``(B, H, a, d)``, ``k`` ``(B, H, b, d)``;
* ``key_mask`` bool, broadcastable to ``(B, H, 1, b)`` (True = key may be attended), or None;
* ``q_index`` ``(B, H, a)`` / ``k_index`` ``(B, H, b)``: long positions of these rows in the full
  sequence (None = ``arange``), for position-dependent scores (e.g. a relative-position bias);
* ``weights`` ``(B, H, a, b)``: softmax over ``b`` with masked keys at exactly 0 (a row whose keys
  are all masked is all 0).

Exact attention is ``score(q, k, mask) @ v``; CUR and Nyström apply the same score to selected or
averaged rows (:mod:`attention.cur`, :mod:`attention.nystrom`), so CUR with L1 scores is a config
change (``configs/attention/l1_cur.yaml``).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class InplaceSoftmax(torch.autograd.Function):
    """Row softmax written into its input ``(..., b)`` (a fresh logits tensor nobody else needs).

    Saves one ``a × b`` allocation per call (on CPU a fresh 16 MB tensor costs more in page faults
    than the softmax itself); backward is the usual ``y ⊙ (g − Σ_b g ⊙ y)``.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor) -> torch.Tensor:
        logits.sub_(logits.amax(-1, keepdim=True)).exp_()
        logits.div_(logits.sum(-1, keepdim=True))
        ctx.mark_dirty(logits)
        ctx.save_for_backward(logits)
        return logits

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (weights,) = ctx.saved_tensors
        grad_weights = grad * weights
        return grad_weights.sub_(weights * grad_weights.sum(-1, keepdim=True))


def masked_softmax(logits: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim of ``logits`` ``(B, H, a, b)``; masked keys get exactly 0.

    ``logits`` is overwritten **in place** (pass a fresh tensor, e.g. a matmul output; autograd
    raises if it were needed elsewhere). Masked logits are set to the dtype's lowest finite value,
    so ``exp`` underflows to 0 whenever a row has a real key; rows with no real key at all are
    zeroed explicitly (instead of NaN).
    """
    if key_mask is not None and not bool(key_mask.all()):
        logits = logits.masked_fill_(~key_mask, torch.finfo(logits.dtype).min)
    weights = InplaceSoftmax.apply(logits)
    if key_mask is not None:
        has_key = key_mask.any(-1, keepdim=True)
        if not bool(has_key.all()):
            weights = weights * has_key
    return weights


class SoftmaxScore(nn.Module):
    """``softmax(Q Kᵀ / √d + mask)`` (Vaswani et al. 2017, eq. 1)."""

    def forward(self, q, k, key_mask=None, q_index=None, k_index=None) -> torch.Tensor:
        scale = q.shape[-1] ** -0.5
        if q.shape[-2] <= k.shape[-2]:  # scale the smaller operand: no extra n × d or n × m tensor
            logits = (q * scale) @ k.transpose(-1, -2)  # (B, H, a, b)
        else:
            logits = q @ (k * scale).transpose(-1, -2)
        return masked_softmax(logits, key_mask)


def _query_chunk(a: int, b: int, d: int, batch: int, budget: int) -> int:
    """Rows of queries per chunk so that a ``(batch, chunk, b, d)`` temporary holds <= ``budget`` elements."""
    return max(1, min(a, budget // max(1, batch * b * d)))


class L1Distance(torch.autograd.Function):
    """``D[i, j] = ‖q_i − k_j‖₁`` ``(B, H, a, b)`` with a query-chunked backward.

    Forward uses ``torch.cdist(p=1)`` (no ``(a, b, d)`` tensor); backward feeds
    ``∂D_ij/∂q_i = sign(q_i − k_j)`` and ``∂D_ij/∂k_j = −sign(q_i − k_j)`` chunk by chunk, so at most
    ``budget`` elements of a ``(B, H, chunk, b, d)`` sign tensor are alive at a time.
    """

    budget = 1 << 24

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(q, k)
        return torch.cdist(q, k, p=1.0)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        q, k = ctx.saved_tensors
        batch, heads, a, d = q.shape
        chunk = _query_chunk(a, k.shape[-2], d, batch * heads, L1Distance.budget)
        grad_q = torch.empty_like(q) if ctx.needs_input_grad[0] else None
        grad_k = torch.zeros_like(k) if ctx.needs_input_grad[1] else None
        for start in range(0, a, chunk):
            rows = slice(start, start + chunk)
            sign = torch.sign(q[:, :, rows, None, :] - k[:, :, None, :, :])  # (B, H, c, b, d)
            g = grad[:, :, rows, :, None]  # (B, H, c, b, 1)
            if grad_q is not None:
                grad_q[:, :, rows] = (g * sign).sum(-2)
            if grad_k is not None:
                grad_k -= (g * sign).sum(-3)
        return grad_q, grad_k


class L1Score(nn.Module):
    """EcoTransformer (Gao & Xu 2025, eq. 1): ``softmax(−λ ‖q_i − k_j‖₁ / √d + mask)``.

    Closer keys get larger weights (mind the sign). The distance runs in float32 with autocast
    disabled (``cdist`` has no fp16/bf16) and never materialises a ``(B, H, a, b, d)`` tensor beyond
    one query chunk (see :class:`L1Distance`). ``lam`` = λ, 1 by default (3 is the paper's "robust").
    """

    def __init__(self, lam: float = 1.0):
        super().__init__()
        if not lam > 0:
            raise ValueError(f"attention.score.lam (λ of the L1 score) must be > 0, got {lam}")
        self.lam = float(lam)

    def forward(self, q, k, key_mask=None, q_index=None, k_index=None) -> torch.Tensor:
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        with torch.autocast(device_type=q.device.type, enabled=False):
            distance = L1Distance.apply(q.to(dtype), k.to(dtype))  # (B, H, a, b)
            return masked_softmax(distance * (-self.lam / math.sqrt(q.shape[-1])), key_mask)
