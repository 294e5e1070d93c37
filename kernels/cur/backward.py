"""FlashCUR backward kernels: tiled recompute of ``R`` and ``C`` from their saved log-sum-exps.

Notation of :mod:`kernels.cur.forward` (``s = 1/√d``, softmaxes in base 2). For a softmax
``P = softmax(S)`` and an upstream gradient ``dP``, ``dS = P ⊙ (dP − Δ)`` with ``Δ = rowsum(dP ⊙ P)``.

* ``RV = R V``, ``R = softmax(s·Q_I Kᵀ + pad mask)`` (m×n). Given ``dRV`` (m×d) and
  ``Δ_R = rowsum(dRV ⊙ RV)``: ``_rv_bwd_kv`` gives ``dK = s·dS_Rᵀ Q_I`` and ``dV = Rᵀ dRV``
  per key tile (all m rows in the program); ``_rv_bwd_q`` gives ``dQ_I = s·dS_R K`` per
  block of selected rows and split of the keys (grid ``(B·H, m / BLOCK_M, S)``), looping over the split's
  key tiles; the ``S`` float32 partials are summed (deterministic: no atomics).
* ``Y_C = C W``, ``C = softmax(s·Q K_Jᵀ)`` (n×m), with ``dY_C = dY`` on unselected rows and 0 on the
  rows ``I`` (those were overwritten by ``RV``). ``_out_bwd_q`` gives ``dQ = s·dS_C K_J`` and
  ``Δ_C = rowsum(dY_C ⊙ Y)`` (from the saved output) per query tile; ``_out_bwd_kw`` gives ``dK_J = s·dS_Cᵀ Q`` and ``dW = Cᵀ dY_C`` per
  block of selected keys and split of the queries, looping over the split's query tiles (partials summed).

Dtypes: ``dK, dV, dQ`` (n×d) are written in the input dtype, the m×d partials and the per-token
statistics (lse, Δ) in float32; with bf16 / fp16 inputs every dot runs on tensor cores
(:func:`kernels.cur.forward.mm_in`).

No program holds more than one (tile × m) block of ``R`` or ``C``; nothing n×m or n×n is stored.
:func:`kernels.cur.run.rv_backward` and :func:`~kernels.cur.run.out_backward` launch them.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common.launch import mm
from kernels.cur.forward import mm_in


@triton.jit
def _rv_bwd_kv(
    QI, K, V, MASK, DRV, LSE, DELTA, DK, DV,
    stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_mb,
    H, N, D, qk_scale, sm_scale,
    M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: a tile of BLOCK_N keys; ``dK, dV`` from all m rows of ``R`` (recomputed), BLOCK_M rows at a time."""
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    n_ok = offs_n < N
    d_ok = offs_d < D
    tile_ok = n_ok[:, None] & d_ok[None, :]
    k = tl.load(K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :], mask=tile_ok, other=0.0)
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=tile_ok, other=0.0)
    real = tl.load(MASK + b * stride_mb + offs_n, mask=n_ok, other=0) != 0
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for start in range(0, M, BLOCK_M):
        offs_j = start + tl.arange(0, BLOCK_M)
        small = pid_bh * M * D + offs_j[:, None] * D + offs_d[None, :]
        q = tl.load(QI + small, mask=d_ok[None, :], other=0.0)
        drv = tl.load(DRV + small, mask=d_ok[None, :], other=0.0)
        lse = tl.load(LSE + pid_bh * M + offs_j)
        delta = tl.load(DELTA + pid_bh * M + offs_j)
        scores_t = mm(k, tl.trans(q), F32_DOT, PRECISION) * qk_scale  # (BLOCK_N, BLOCK_M) = (s·Q_I Kᵀ)ᵀ
        p_t = tl.where(real[:, None], tl.exp2(scores_t - lse[None, :]), 0.0)
        dv += mm_in(p_t, drv, k, F32_DOT, PRECISION)
        dp_t = mm_in(v, tl.trans(drv), k, F32_DOT, PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += mm(ds_t, q, F32_DOT, PRECISION)
    out = pid_bh * N * D + offs_n[:, None] * D + offs_d[None, :]
    tl.store(DK + out, (dk * sm_scale).to(DK.dtype.element_ty), mask=tile_ok)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=tile_ok)


@triton.jit
def _rv_bwd_q(
    QI, K, V, MASK, DRV, LSE, DELTA, DQI,
    stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_mb,
    H, N, D, M, SPLIT_N, qk_scale, sm_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: BLOCK_M selected query rows; their ``dQ_I`` over the key tiles of split ``program_id(2)``
    (``SPLIT_N`` keys), written at ``[bh, s]`` of ``(B·H, S, M, D)`` float32 partials (summed over ``s``)."""
    pid_bh = tl.program_id(0)
    split = tl.program_id(2)
    part = pid_bh * tl.num_programs(2) + split
    b = pid_bh // H
    h = pid_bh % H
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    small = pid_bh * M * D + offs_m[:, None] * D + offs_d[None, :]
    q = tl.load(QI + small, mask=d_ok[None, :], other=0.0)
    drv = tl.load(DRV + small, mask=d_ok[None, :], other=0.0)
    lse = tl.load(LSE + pid_bh * M + offs_m)
    delta = tl.load(DELTA + pid_bh * M + offs_m)
    lo = split * SPLIT_N  # this split's keys: [lo, min(lo + SPLIT_N, N))
    count = tl.minimum(SPLIT_N, N - lo)
    k_base = K + b * stride_kb + h * stride_kh + lo * stride_kn
    v_base = V + b * stride_vb + h * stride_vh + lo * stride_vn
    mask_base = MASK + b * stride_mb + lo
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, count, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < count
        tile_ok = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=tile_ok, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=tile_ok, other=0.0)
        real = tl.load(mask_base + offs_n, mask=n_ok, other=0) != 0
        scores = mm(q, tl.trans(k), F32_DOT, PRECISION) * qk_scale
        p = tl.where(real[None, :], tl.exp2(scores - lse[:, None]), 0.0)
        dp = mm_in(drv, tl.trans(v), k, F32_DOT, PRECISION)
        ds = p * (dp - delta[:, None])
        dq += mm(ds, k, F32_DOT, PRECISION)
    tl.store(DQI + part * M * D + offs_m[:, None] * D + offs_d[None, :], dq * sm_scale, mask=d_ok[None, :])


@triton.jit
def _c_chunk(q, dy, lse, KJ, W, VALIDK, pid_bh, offs_j, offs_d, d_ok, D, qk_scale,
             M: tl.constexpr, F32_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """Columns ``offs_j`` of ``C`` (recomputed from its log-sum-exp) and of ``dC = dY_C Wᵀ``, and ``K_J``'s rows."""
    small = pid_bh * M * D + offs_j[:, None] * D + offs_d[None, :]
    kj = tl.load(KJ + small, mask=d_ok[None, :], other=0.0)
    w = tl.load(W + small, mask=d_ok[None, :], other=0.0)
    valid = tl.load(VALIDK + pid_bh * M + offs_j) != 0
    p = tl.where(valid[None, :], tl.exp2(mm(q, tl.trans(kj), F32_DOT, PRECISION) * qk_scale - lse[:, None]), 0.0)
    return p, mm_in(dy, tl.trans(w), q, F32_DOT, PRECISION), kj


@triton.jit
def _out_bwd_q(
    Q, KJ, VALIDK, W, SLOT, DY, Y, LSE, DQ, DELTA,
    stride_qb, stride_qh, stride_qn, stride_gb, stride_gh, stride_gn, stride_yb, stride_yh, stride_yn,
    H, N, D, qk_scale, sm_scale,
    M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: a tile of BLOCK_N query rows; ``dQ`` from the recomputed ``C`` tile, BLOCK_M keys at a
    time, and ``Δ_C``, read off the saved output as flash attention's backward does: ``Σ_j P_ij (dY_i · W_j) =
    dY_i · (C W)_i``, and ``Y``'s free rows are ``C W`` (its rows ``I``, which hold ``RV``, have ``dY_C = 0``).
    One pass over the keys; ``Y`` and ``dY`` are read sixteen columns at a time for ``Δ_C`` before ``q`` is loaded,
    which keeps the registers below where ptxas spills (docs/flashcur.md)."""
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    n_ok = offs_n < N
    d_ok = offs_d < D
    free = tl.load(SLOT + pid_bh * N + offs_n, mask=n_ok, other=0) < 0  # rows not overwritten by RV
    dy = tl.load(DY + b * stride_gb + h * stride_gh + offs_n[:, None] * stride_gn + offs_d[None, :],
                 mask=(n_ok & free)[:, None] & d_ok[None, :], other=0.0)
    delta = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, BLOCK_D, 16):  # 16 columns of Y at a time: few registers, before q is loaded
        cols = start + tl.arange(0, 16)
        y = tl.load(Y + b * stride_yb + h * stride_yh + offs_n[:, None] * stride_yn + cols[None, :],
                    mask=n_ok[:, None] & (cols < D)[None, :], other=0.0)
        dy_cols = tl.load(DY + b * stride_gb + h * stride_gh + offs_n[:, None] * stride_gn + cols[None, :],
                          mask=(n_ok & free)[:, None] & (cols < D)[None, :], other=0.0)
        delta += tl.sum(dy_cols.to(tl.float32) * y.to(tl.float32), 1)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_n[:, None] * stride_qn + offs_d[None, :],
                mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    lse = tl.load(LSE + pid_bh * N + offs_n, mask=n_ok, other=0.0)
    dq = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for start in range(0, M, BLOCK_M):
        p, dp, kj = _c_chunk(q, dy, lse, KJ, W, VALIDK, pid_bh, start + tl.arange(0, BLOCK_M), offs_d, d_ok, D,
                             qk_scale, M, F32_DOT, PRECISION)
        ds = p * (dp - delta[:, None])
        dq += mm(ds, kj, F32_DOT, PRECISION)
    tl.store(DQ + pid_bh * N * D + offs_n[:, None] * D + offs_d[None, :], (dq * sm_scale).to(DQ.dtype.element_ty),
             mask=n_ok[:, None] & d_ok[None, :])
    tl.store(DELTA + pid_bh * N + offs_n, delta, mask=n_ok)


@triton.jit
def _out_bwd_kw(
    Q, KJ, VALIDK, W, SLOT, DY, LSE, DELTA, DKJ, DW,
    stride_qb, stride_qh, stride_qn, stride_gb, stride_gh, stride_gn,
    H, N, D, M, SPLIT_N, qk_scale, sm_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: BLOCK_M selected keys; ``dK_J, dW`` over the query tiles (``Cᵀ`` tiles) of split
    ``program_id(2)`` (``SPLIT_N`` queries), written at ``[bh, s]`` of ``(B·H, S, M, D)`` float32 partials."""
    pid_bh = tl.program_id(0)
    split = tl.program_id(2)
    part = pid_bh * tl.num_programs(2) + split
    b = pid_bh // H
    h = pid_bh % H
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    small = pid_bh * M * D + offs_m[:, None] * D + offs_d[None, :]
    kj = tl.load(KJ + small, mask=d_ok[None, :], other=0.0)
    w = tl.load(W + small, mask=d_ok[None, :], other=0.0)
    valid = tl.load(VALIDK + pid_bh * M + offs_m) != 0
    dk = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dw = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo = split * SPLIT_N  # this split's queries: [lo, min(lo + SPLIT_N, N))
    count = tl.minimum(SPLIT_N, N - lo)
    q_base = Q + b * stride_qb + h * stride_qh + lo * stride_qn
    dy_base = DY + b * stride_gb + h * stride_gh + lo * stride_gn
    row_base = pid_bh * N + lo  # of SLOT, LSE, DELTA
    for start in range(0, count, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < count
        q = tl.load(q_base + offs_n[:, None] * stride_qn + offs_d[None, :], mask=n_ok[:, None] & d_ok[None, :],
                    other=0.0)
        free = tl.load(SLOT + row_base + offs_n, mask=n_ok, other=0) < 0
        dy = tl.load(dy_base + offs_n[:, None] * stride_gn + offs_d[None, :],
                     mask=(n_ok & free)[:, None] & d_ok[None, :], other=0.0)
        lse = tl.load(LSE + row_base + offs_n, mask=n_ok, other=0.0)
        delta = tl.load(DELTA + row_base + offs_n, mask=n_ok, other=0.0)
        scores_t = mm(kj, tl.trans(q), F32_DOT, PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N) = (s·Q K_Jᵀ)ᵀ
        p_t = tl.where(valid[:, None] & n_ok[None, :], tl.exp2(scores_t - lse[None, :]), 0.0)
        dw += mm_in(p_t, dy, q, F32_DOT, PRECISION)
        dp_t = mm_in(w, tl.trans(dy), q, F32_DOT, PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += mm(ds_t, q, F32_DOT, PRECISION)
    partial = part * M * D + offs_m[:, None] * D + offs_d[None, :]
    tl.store(DKJ + partial, dk * sm_scale, mask=d_ok[None, :])
    tl.store(DW + partial, dw, mask=d_ok[None, :])
