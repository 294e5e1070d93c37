"""The two sequence-sized stages of landmark attention (CUR, Nyström) in the fused forms (:mod:`attention.paths`).

With ``m`` landmark rows (CUR's selected ``Q_I, K_J``; Nyström's segment means ``Q̃, K̃``), ``s = 1/√d``::

    rows_attention(Q_m, K, V, key_mask)   = softmax_n(s Q_m Kᵀ + pad mask) V     m queries over n keys   (B, H, m, d)
    columns_attention(Q, K_m, W, valid)   = softmax_m(s Q K_mᵀ + slot mask) W    n queries over m keys   (B, H, n, d)

(CUR's ``R V`` and ``C W``; Nyström's ``k3 V`` and ``k1 W``.) Both materialise their ``n × m`` weights, stored
``(B, H, n, m)`` in the inputs' dtype (bf16 under autocast: ``B·H·n·m`` elements, as many as ``V`` holds when
``m = 2d``), and run every product as a batched GEMM (tensor cores in bf16, float32 accumulation), never an
attention kernel: a general attention kernel given 64 queries or 64 keys runs ``B·H`` programs that each walk all
``n`` tokens (16 programs on a 132-SM GPU at ``B·H = 16``). Here every sequence-sized operator spreads over ``n``:

* GEMMs whose output is ``n × ·`` (scores, ``Y``, ``dV``, ``dQ``, ``dK``) have ``B·H·n/128`` tiles;
* GEMMs that *reduce* over ``n`` (``R V``, and in the backward ``dQ_m``, ``dK_m``, ``dW``) are split-K by hand:
  ``n = c·L`` is viewed as ``c`` chunks (a free view of a ``(B, H, n, ·)`` tensor), one batched GEMM over
  ``(B, H, c)`` gives ``c`` partials, a float32 sum over ``c`` merges them. ``c`` (:func:`chunks`) is the
  smallest divisor of ``n`` that makes ``B·H·c ≥`` :data:`TWO_WAVES` programs;
* softmaxes and reductions over ``n`` are ATen's, which split the reduced dimension across blocks.

``rows_attention`` normalises after its product (``R V = (E V) / l`` with ``E = exp(S − max)``, ``l = Σ_n E``:
flash attention's order); its backward needs no row sum over ``n`` (``Σ_j P_ji dP_ji = dRV_i · RV_i``). Neither
stage keeps its ``n × m`` weights for the backward: both save their operands and per-row statistics and recompute
the weights (as SDPA does), so a layer holds what SDPA's would between forward and backward.

Precision: scores, weights and split-K partials in the inputs' dtype (bf16: each rounds to 2⁻⁸ relative), every
sum and every ``m``-sized result (``R V``, ``dW``, ``dQ_m``, ``dK_m``, :func:`core_weights`) in float32; float32 and
float64 inputs stay what they are (the exactness tests). Masked positions get ``finfo(dtype).min / 2`` (finite: a
row without keys stays finite).
"""

from __future__ import annotations

import math

import torch

from attention import paths
from attention.paths import masked_value
from kernels.common.launch import TWO_WAVES


def chunks(n: int, batch_heads: int) -> int:
    """``c``: the number of chunks a reduction over ``n`` is split into, the smallest divisor of ``n`` with
    ``batch_heads · c ≥`` :data:`TWO_WAVES` (``n`` itself if none; 1 when ``batch_heads`` alone fills the GPU)."""
    need = math.ceil(TWO_WAVES / batch_heads)
    return next((c for c in range(need, n + 1) if n % c == 0), n) if need > 1 else 1


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """The dtype of sums and ``m``-sized results: float32, float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def split_k(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aᵀ b`` in float32 (float64 stays) for contiguous ``a`` ``(B, H, n, p)`` and ``b`` ``(B, H, n, q)`` ->
    ``(B, H, p, q)``: :func:`chunks` batched GEMMs of ``L = n / c`` rows each (partials in the inputs' dtype), then
    the float32 sum of their ``c`` partials."""
    batch, heads, n, p = a.shape
    c = chunks(n, batch * heads)
    parts = a.view(batch, heads, c, n // c, p).mT @ b.view(batch, heads, c, n // c, b.shape[-1])  # (B, H, c, p, q)
    return parts.sum(2, dtype=accumulator(a.dtype))


def _row_weights(q_scaled, k, key_mask, row_max=None):
    """``E = exp(s Q_m Kᵀ + mask − max)`` stored ``(B, H, n, m)`` and the max over n ``(B, H, 1, m)`` (given by the
    forward when the backward recomputes ``E``: the same operators on the same operands, the same values)."""
    e = torch.where(key_mask[:, None, :, None], k @ q_scaled.mT, masked_value(k.dtype))  # Sᵀ, (B, H, n, m)
    row_max = e.amax(-2, keepdim=True) if row_max is None else row_max
    return e.sub_(row_max).exp_(), row_max


def _column_weights(q, k_scaled, valid):
    """``P = softmax_m(s Q K_mᵀ + slot mask)`` ``(B, H, n, m)``, float32 arithmetic inside, stored in ``q``'s dtype."""
    return torch.softmax(torch.where(valid[:, :, None, :], q @ k_scaled.mT, masked_value(q.dtype)), -1)


class _RowsAttention(torch.autograd.Function):
    """``softmax_n(s Q_m Kᵀ + mask) V`` (module doc). Saves its operands and per-row statistics only; the backward
    recomputes ``E`` (one GEMM and two pointwise passes), so a layer keeps no ``n × m`` tensor between its forward
    and its backward (what SDPA keeps: its operands and log-sum-exps)."""

    @staticmethod
    def forward(ctx, q_rows, k, v, key_mask):
        q_scaled = q_rows * q_rows.shape[-1] ** -0.5  # (B, H, m, d)
        e, row_max = _row_weights(q_scaled, k, key_mask)
        total = e.sum(-2, dtype=accumulator(e.dtype))  # l, (B, H, m)
        rv = split_k(e, v) / total[..., None]  # (B, H, m, d) float32
        ctx.save_for_backward(q_scaled, k, v, key_mask, row_max, total, rv)
        return rv

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        q_scaled, k, v, key_mask, row_max, total, rv = ctx.saved_tensors
        e, _ = _row_weights(q_scaled, k, key_mask, row_max)
        grad = grad / total[..., None]  # dRV_i / l_i, (B, H, m, d) float32
        delta = (grad * rv).sum(-1)  # dRV_i · RV_i / l_i = Σ_j P_ji dP_ji / l_i, (B, H, m)
        grad_x = grad.to(v.dtype)
        d_scores = (v @ grad_x.mT).sub_(delta[:, :, None, :].to(v.dtype)).mul_(e)  # dSᵀ, (B, H, n, m)
        grad_v = e @ grad_x  # (B, H, n, d)
        grad_k = d_scores @ q_scaled  # (B, H, n, d)
        grad_q = split_k(d_scores, k).mul_(q_scaled.shape[-1] ** -0.5)  # (B, H, m, d) float32
        return grad_q.to(q_scaled.dtype), grad_k, grad_v, None


class _ColumnsAttention(torch.autograd.Function):
    """``softmax_m(s Q K_mᵀ + slot mask) W`` (module doc). Saves its operands only; the backward recomputes the
    weights ``P`` (one GEMM, a mask and a softmax)."""

    @staticmethod
    def forward(ctx, q, k_cols, w, valid):
        k_scaled = (k_cols * q.shape[-1] ** -0.5).to(q.dtype)  # (B, H, m, d)
        w_x = w.to(q.dtype)
        ctx.save_for_backward(q, k_scaled, w_x, valid)
        ctx.dtypes = (k_cols.dtype, w.dtype)
        return _column_weights(q, k_scaled, valid) @ w_x  # (B, H, n, d)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        q, k_scaled, w_x, valid = ctx.saved_tensors
        weights = _column_weights(q, k_scaled, valid)
        grad = grad.contiguous()
        d_scores = torch._softmax_backward_data(grad @ w_x.mT, weights, -1, weights.dtype)  # (B, H, n, m)
        grad_q = d_scores @ k_scaled  # (B, H, n, d)
        grad_k = split_k(d_scores, q).mul_(q.shape[-1] ** -0.5)  # (B, H, m, d) float32
        grad_w = split_k(weights, grad)  # (B, H, m, d) float32
        return grad_q, grad_k.to(ctx.dtypes[0]), grad_w.to(ctx.dtypes[1]), None


def core_weights(q_rows: torch.Tensor, k_rows: torch.Tensor, valid_rows: torch.Tensor, valid_cols: torch.Tensor) -> torch.Tensor:
    """``softmax_m(s Q_m K_mᵀ + slot mask)`` with identity rows on invalid rows, float32 (float64 stays)
    ``(B, H, m, m)``, for ``q_rows, k_rows`` ``(B, H, m, d)`` and bool ``valid_rows``, ``valid_cols`` ``(B, H or 1, m)``:
    CUR's ``U = C[I]``, Nyström's ``k2``; what the pseudo-inverse inverts, so ``m``-sized and kept in float32."""
    dtype = accumulator(q_rows.dtype)
    scores = (q_rows.to(dtype) @ k_rows.to(dtype).mT) * q_rows.shape[-1] ** -0.5  # (B, H, m, m)
    weights = torch.softmax(torch.where(valid_cols[:, :, None, :], scores, masked_value(dtype)), -1)
    return torch.where(valid_rows[..., None], weights, paths.identity(q_rows.shape[-2], dtype, q_rows.device))


def rows_attention(q_rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """``softmax(s Q_m Kᵀ + pad mask) V`` float32 ``(B, H, m, d)`` for ``q_rows`` ``(B, H, m, d)``, ``k, v`` ``(B, H, n, d)``
    of one dtype and ``key_mask`` bool ``(B, n)`` (True = attend)."""
    return _RowsAttention.apply(q_rows, k.contiguous(), v.contiguous(), key_mask)


def columns_attention(q: torch.Tensor, k_cols: torch.Tensor, w: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``softmax(s Q K_mᵀ + slot mask) W`` in ``q``'s dtype ``(B, H, n, d)`` for ``q`` ``(B, H, n, d)``, ``k_cols`` and
    ``w`` ``(B, H, m, d)`` (any float dtype: cast to ``q``'s for the products) and ``valid`` bool ``(B, H or 1, m)``
    (the keys that may be attended)."""
    return _ColumnsAttention.apply(q.contiguous(), k_cols, w, valid)
