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
  ``n`` is cut into ``c`` chunks of ``L`` tokens (:func:`chunks`: ``B·H·c ≥`` :data:`TWO_WAVES` programs where
  chunks of at least :data:`MIN_CHUNK` tokens allow it), one batched GEMM over ``(B, H, c)`` gives ``c``
  partials, a float32 sum over ``c`` merges them. When ``c`` divides ``n`` the chunks are a free view of the
  ``(B, H, n, ·)`` operands; otherwise both operands are copied into ``c·L`` rows whose last ``c·L − n`` are zero
  (:func:`chunked`), which add exactly nothing (``0 · 0``): any ``n`` works, a prime one too;
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
from kernels.cur import launch as cur_launch
from kernels.cur import ops as cur_ops


MIN_CHUNK = 64  # fewest tokens a chunk holds where n allows: shorter ones make the partials outgrow the input


def chunks(n: int, batch_heads: int) -> tuple[int, int]:
    """``(c, L)``: a reduction over ``n`` split into ``c`` chunks of ``L`` tokens, ``(c − 1)·L < n ≤ c·L``.

    ``need = ⌈TWO_WAVES / batch_heads⌉`` chunks fill two waves; no chunk is shorter than :data:`MIN_CHUNK` tokens
    (at most ``⌊n / MIN_CHUNK⌋`` chunks, so a short ``n`` gets fewer than ``need``: its GEMMs are small). A divisor
    of ``n`` in ``[need, 2·need]`` is taken when there is one (the chunks are then a view, nothing is padded);
    otherwise ``L = ⌈n / need⌉`` and ``c = ⌈n / L⌉`` (the last chunk padded, never an empty one). ``(1, n)`` when
    ``batch_heads`` alone fills the GPU."""
    need = min(math.ceil(TWO_WAVES / batch_heads), max(n // MIN_CHUNK, 1))
    if need <= 1:
        return 1, n
    c = next((c for c in range(need, min(2 * need, n // MIN_CHUNK) + 1) if n % c == 0), None)
    if c is not None:
        return c, n // c
    length = math.ceil(n / need)
    return math.ceil(n / length), length


def chunked(x: torch.Tensor, c: int, length: int, value: float = 0.0) -> torch.Tensor:
    """``x`` ``(..., n, p)`` as ``(..., c, L, p)`` (:func:`chunks`): a view when ``c·L = n``, else a copy whose
    ``c·L − n`` added rows hold ``value``."""
    n = x.shape[-2]
    if c * length != n:
        x = torch.nn.functional.pad(x, (0, 0, 0, c * length - n), value=value)
    return x.view(*x.shape[:-2], c, length, x.shape[-1])


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """The dtype of sums and ``m``-sized results: float32, float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def split_k(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aᵀ b`` in float32 (float64 stays) for ``a`` ``(B, H, c, L, p)`` and ``b`` ``(B, H, c, L, q)`` (chunked,
    :func:`chunked`) -> ``(B, H, p, q)``: one batched GEMM over ``(B, H, c)`` (partials in the inputs' dtype; the
    zero rows that pad the last chunk add nothing), then the float32 sum of the ``c`` partials."""
    return (a.mT @ b).sum(2, dtype=accumulator(a.dtype))


def unchunked(x: torch.Tensor, n: int) -> torch.Tensor:
    """``(B, H, c, L, p)`` -> ``(B, H, n, p)``: the first ``n`` of the ``c·L`` rows (a view)."""
    x = x.flatten(2, 3)
    return x if x.shape[2] == n else x[:, :, :n]


def scaled(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``x · scale`` stored contiguous in ``dtype``, by one kernel (computed in ``x``'s dtype or wider, rounded once
    on the store): a scale and a cast, each an ``m``-sized launch at its floor on a GPU, made one. Not
    differentiable (an ``out=`` operation): for the custom Functions' own forward and backward."""
    return torch.mul(x, scale, out=torch.empty(x.shape, dtype=dtype, device=x.device))


def per_chunk(x: torch.Tensor, c: int, scale: float = 1.0, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``(B, H, r, p)`` -> ``(B, H, c, r, p)``, one copy per chunk (contiguous: a batched GEMM against chunked
    operands takes it as it is; a broadcast operand would be copied by every product that meets it), scaled by
    ``scale`` and cast to ``dtype`` (default ``x``'s) by the same kernel (:func:`scaled`)."""
    return scaled(x[:, :, None].expand(-1, -1, c, -1, -1), scale, dtype or x.dtype)


def _row_weights(q_scaled, k, key_mask, row_max=None):
    """``E = exp(s Q_m Kᵀ + mask − max)`` stored ``(B, H, c, L, m)`` (chunked, pads masked: 0 after the exp) and the
    max over n ``(B, H, 1, 1, m)`` (given by the forward when the backward recomputes ``E``: the same operators on the
    same operands, the same values), for ``q_scaled`` :func:`per_chunk` ``(B, H, c, m, d)``. The max is taken per
    chunk, then over the ``c`` chunks."""
    e = torch.where(key_mask[:, None, :, :, None], k @ q_scaled.mT, masked_value(k.dtype))  # Sᵀ
    row_max = e.amax(-2, keepdim=True).amax(-3, keepdim=True) if row_max is None else row_max
    return e.sub_(row_max).exp_(), row_max


def _column_weights(q, k_scaled, valid):
    """``P = softmax_m(s Q K_mᵀ + slot mask)`` ``(B, H, c, L, m)`` for chunked ``q`` and :func:`per_chunk`
    ``k_scaled``, float32 arithmetic inside, stored in ``q``'s dtype."""
    scores = q @ k_scaled.mT
    return torch.softmax(torch.where(valid[:, :, None, None, :], scores, masked_value(q.dtype)), -1)


class _RowsAttention(torch.autograd.Function):
    """``softmax_n(s Q_m Kᵀ + mask) V`` (module doc) on chunked ``k, v`` ``(B, H, c, L, d)`` and ``key_mask``
    ``(B, c, L)`` (pads False). Saves its operands and per-row statistics only; the backward recomputes ``E`` (one
    GEMM and two pointwise passes), so a layer keeps no ``n × m`` tensor between its forward and its backward (what
    SDPA keeps: its operands and log-sum-exps). Its key and value gradients come back chunked."""

    @staticmethod
    def forward(ctx, q_rows, k, v, key_mask):
        q_scaled = per_chunk(q_rows, k.shape[2], q_rows.shape[-1] ** -0.5)  # (B, H, c, m, d)
        e, row_max = _row_weights(q_scaled, k, key_mask)  # (B, H, c, L, m)
        total = e.sum(-2, dtype=accumulator(e.dtype)).sum(-2)  # l, (B, H, m)
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
        grad_x = per_chunk(grad, v.shape[2], dtype=v.dtype)  # (B, H, c, m, d)
        d_scores = (v @ grad_x.mT).sub_(delta[:, :, None, None, :]).mul_(e)  # dSᵀ, (B, H, c, L, m)
        grad_v = e @ grad_x  # (B, H, c, L, d)
        grad_k = d_scores @ q_scaled  # (B, H, c, L, d)
        grad_q = scaled(split_k(d_scores, k), q_scaled.shape[-1] ** -0.5, q_scaled.dtype)  # (B, H, m, d)
        return grad_q, grad_k, grad_v, None


class _ColumnsAttention(torch.autograd.Function):
    """``softmax_m(s Q K_mᵀ + slot mask) W`` (module doc) for chunked ``q`` ``(B, H, c, L, d)``; its output and
    ``q``'s gradient chunked too (pad rows: whatever the zero queries give, cut off by :func:`unchunked`; their
    gradient rows are zero, so they add nothing to ``dK_m``, ``dW``). Saves its operands only; the backward
    recomputes the weights ``P`` (one GEMM, a mask and a softmax)."""

    @staticmethod
    def forward(ctx, q, k_cols, w, valid):
        k_scaled = per_chunk(k_cols, q.shape[2], q.shape[-1] ** -0.5, q.dtype)  # (B, H, c, m, d)
        w_x = per_chunk(w, q.shape[2], dtype=q.dtype)
        ctx.save_for_backward(q, k_scaled, w_x, valid)
        ctx.dtypes = (k_cols.dtype, w.dtype)
        return _column_weights(q, k_scaled, valid) @ w_x  # (B, H, c, L, d)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        q, k_scaled, w_x, valid = ctx.saved_tensors
        weights = _column_weights(q, k_scaled, valid)
        grad = grad.contiguous()  # (B, H, c, L, d), zero on the pad rows
        d_scores = torch._softmax_backward_data(grad @ w_x.mT, weights, -1, weights.dtype)  # (B, H, c, L, m)
        grad_q = d_scores @ k_scaled  # (B, H, c, L, d)
        grad_k = scaled(split_k(d_scores, q), q.shape[-1] ** -0.5, ctx.dtypes[0])  # (B, H, m, d)
        grad_w = split_k(weights, grad)  # (B, H, m, d) float32
        return grad_q, grad_k, grad_w.to(ctx.dtypes[1]), None


def core_weights(q_rows: torch.Tensor, k_rows: torch.Tensor, valid_rows: torch.Tensor, valid_cols: torch.Tensor) -> torch.Tensor:
    """``softmax_m(s Q_m K_mᵀ + slot mask)`` with identity rows on invalid rows, float32 (float64 stays)
    ``(B, H, m, m)``, for ``q_rows, k_rows`` ``(B, H, m, d)`` and bool ``valid_rows``, ``valid_cols`` ``(B, H or 1, m)``:
    CUR's ``U = C[I]``, Nyström's ``k2``; what the pseudo-inverse inverts, so ``m``-sized and kept in float32."""
    dtype = accumulator(q_rows.dtype)
    scores = (q_rows.to(dtype) @ k_rows.to(dtype).mT) * q_rows.shape[-1] ** -0.5  # (B, H, m, m)
    weights = torch.softmax(torch.where(valid_cols[:, :, None, :], scores, masked_value(dtype)), -1)
    return torch.where(valid_rows[..., None], weights, paths.identity(q_rows.shape[-2], dtype, q_rows.device))


def rows_attention(q_rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor,
                   form: str = "fused") -> torch.Tensor:
    """``softmax(s Q_m Kᵀ + pad mask) V`` float32 ``(B, H, m, d)`` for ``q_rows`` ``(B, H, m, d)``, ``k, v`` ``(B, H, n, d)``
    of one dtype and ``key_mask`` bool ``(B, n)`` (True = attend); ``n`` in :func:`chunks` (pads masked).

    ``form`` (``attention.impl``'s ``Forms.rows``): ``triton`` runs FlashCUR's kernel (a) and its backward
    (:func:`kernels.cur.ops.rv_forward`: an online softmax over ``n``, split over ``n`` and merged by one kernel;
    nothing ``n × m`` is stored, forward or backward: two Triton kernels forward and two backward, with a few
    ``m``-sized operators, where this module's stage launches 12 and 16 kernels) where they take the operands
    (:func:`kernels.cur.launch.rows_fit`: at most 128 rows, padded with zero rows to 16, 32, 64 or 128, their
    results cut off; 16 ≤ d ≤ 128; values as wide as the queries; float32, float16 or bfloat16 tiles within the
    GPU's shared memory); else (a diagnostic's ``V = I`` among them), and with ``fused``, the split-K stage above."""
    m, d = q_rows.shape[-2:]
    if (form == "triton" and q_rows.dtype == k.dtype == v.dtype and v.shape[-1] == d
            and cur_launch.rows_fit(m, d, k.dtype, k.device)):
        size = cur_launch.padded_m(m)
        rows = torch.nn.functional.pad(q_rows, (0, 0, 0, size - m)) if size > m else q_rows.contiguous()
        rv, _ = cur_ops.rv_forward(rows, k, v, key_mask)  # (B, H, size, d) float32
        return rv[:, :, :m] if size > m else rv
    batch, heads, n, _ = k.shape
    c, length = chunks(n, batch * heads)
    mask = chunked(key_mask[..., None], c, length, False)[..., 0]  # (B, c, L)
    return _RowsAttention.apply(q_rows, chunked(k.contiguous(), c, length), chunked(v.contiguous(), c, length), mask)


def columns_attention(q: torch.Tensor, k_cols: torch.Tensor, w: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``softmax(s Q K_mᵀ + slot mask) W`` in ``q``'s dtype ``(B, H, n, d)`` for ``q`` ``(B, H, n, d)``, ``k_cols`` and
    ``w`` ``(B, H, m, d)`` (any float dtype: cast to ``q``'s for the products) and ``valid`` bool ``(B, H or 1, m)``
    (the keys that may be attended); ``n`` in :func:`chunks` (zero queries pad the last, their rows cut off)."""
    batch, heads, n, _ = q.shape
    c, length = chunks(n, batch * heads)
    return unchunked(_ColumnsAttention.apply(chunked(q.contiguous(), c, length), k_cols, w, valid), n)
