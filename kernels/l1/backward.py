"""FlashL1 backward (EcoTransformer L1 attention, Gao & Xu 2025, eq. 1): tiles recomputed from ``q, k, L``.

Notation of :mod:`kernels.l1.forward`: ``S_ij = −λ‖q_i − k_j‖₁/√d`` (−inf on pad keys), ``P = softmax(S)``,
``Y = P V``, ``L`` the row log-sum-exp saved by the forward. Given ``dY`` and ``Δ_i = rowsum(dY ⊙ Y)_i``::

    P_ij  = exp(S_ij − L_i)                         (recomputed tile by tile, never stored)
    dV    = Pᵀ dY
    dS_ij = P_ij ((dY Vᵀ)_ij − Δ_i)
    dq_i  = (−λ/√d) Σ_j dS_ij sign(q_i − k_j)       (∂‖q_i − k_j‖₁/∂q_i = sign(q_i − k_j), sign(0) = 0)
    dk_j  = (−λ/√d) Σ_i dS_ij sign(k_j − q_i)       (= −(−λ/√d) Σ_i dS_ij sign(q_i − k_j))

``_l1_bwd_kv``: one program per tile of ``BLOCK_N`` keys and block of ``BLOCK_DO`` of the ``d`` columns of
``dK, dV`` (where both float32 accumulators would spill registers, the columns are split over programs
that each recompute ``Pᵀ`` and ``dSᵀ``), looping over query tiles, gives ``dK, dV``; ``_l1_bwd_q``: one
program per tile of ``BLOCK_M`` queries, looping over key tiles, gives ``dQ``. ``dY Vᵀ`` and ``Pᵀ dY`` are
``tl.dot``s; the sign sums are float32, column by column of ``d`` (:func:`_sign_sum`). No n × n tensor
is stored; gradients are written in the inputs' dtype, ``Δ`` (``(B, H, n)`` float32) is computed by PyTorch
in :func:`kernels.l1.launch.l1_backward`, which launches both kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common.launch import mm
from kernels.l1.forward import dot_zeros, l1_tile


@triton.jit
def _sign_sum(acc, ds, a_rows, b_rows, a_ok, b_ok, D, BLOCK_D: tl.constexpr):
    """``acc[a, c] += Σ_b ds[a, b] · sign(x_ac − y_bc)`` for ``c < D``; ``a_rows, b_rows`` point at the rows."""
    offs_d = tl.arange(0, BLOCK_D)
    for c in range(0, D):
        x = tl.load(a_rows + c, mask=a_ok, other=0.0).to(tl.float32)
        y = tl.load(b_rows + c, mask=b_ok, other=0.0).to(tl.float32)
        diff = x[:, None] - y[None, :]
        column = tl.sum(tl.where(diff > 0, ds, tl.where(diff < 0, -ds, 0.0)), 1)
        acc = tl.where(offs_d[None, :] == c, acc + column[:, None], acc)
    return acc


@triton.jit
def _l1_bwd_kv(
    Q, K, V, MASK, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_gb, stride_gh, stride_gn, stride_mb,
    H, N, D, score_scale, grad_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DO: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: BLOCK_N keys and BLOCK_DO of the d columns of their ``dK, dV`` (``BLOCK_DO < BLOCK_D``
    splits the accumulators over programs, which recompute ``Pᵀ`` and ``dSᵀ``), over all query tiles."""
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    tile = tl.program_id(1) // (BLOCK_D // BLOCK_DO)
    first = tl.program_id(1) % (BLOCK_D // BLOCK_DO) * BLOCK_DO  # first output column of this program
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_o = first + tl.arange(0, BLOCK_DO)
    n_ok = offs_n < N
    d_ok = offs_d < D
    o_ok = offs_o < D
    real = tl.load(MASK + b * stride_mb + offs_n, mask=n_ok, other=0) != 0
    k_rows = K + b * stride_kb + h * stride_kh + offs_n * stride_kn
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    q_base = Q + b * stride_qb + h * stride_qh
    g_base = DO + b * stride_gb + h * stride_gh
    columns = tl.minimum(D - first, BLOCK_DO)
    dk = tl.zeros([BLOCK_N, BLOCK_DO], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DO], tl.float32)
    zero = dot_zeros(BLOCK_N, BLOCK_M)
    for start in range(0, N, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        m_ok = offs_m < N
        q_rows = q_base + offs_m * stride_qn
        do = tl.load(g_base + offs_m[:, None] * stride_gn + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        lse = tl.load(LSE + pid_bh * N + offs_m, mask=m_ok, other=0.0)
        delta = tl.load(DELTA + pid_bh * N + offs_m, mask=m_ok, other=0.0)
        dist_t = l1_tile(zero, k_rows, q_rows, n_ok, m_ok, D)  # (BLOCK_N, BLOCK_M)
        p_t = tl.where(real[:, None] & m_ok[None, :], tl.exp2(dist_t * score_scale - lse[None, :]), 0.0)
        if BLOCK_DO == BLOCK_D:
            do_out = do
        else:
            do_out = tl.load(g_base + offs_m[:, None] * stride_gn + offs_o[None, :], mask=m_ok[:, None] & o_ok[None, :],
                             other=0.0)
        dv += mm(p_t, do_out, F32_DOT, PRECISION)
        ds_t = p_t * (mm(v, tl.trans(do), F32_DOT, PRECISION) - delta[None, :])
        dk = _sign_sum(dk, ds_t, k_rows + first, q_rows + first, n_ok, m_ok, columns, BLOCK_DO)
    out = pid_bh * N * D + offs_n[:, None] * D + offs_o[None, :]
    tile_ok = n_ok[:, None] & o_ok[None, :]
    tl.store(DK + out, (dk * grad_scale).to(DK.dtype.element_ty), mask=tile_ok)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=tile_ok)


@triton.jit
def _l1_bwd_q(
    Q, K, V, MASK, DO, LSE, DELTA, DQ,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_gb, stride_gh, stride_gn, stride_mb,
    H, N, D, score_scale, grad_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: BLOCK_M queries; ``dQ`` accumulated over key tiles (``P`` tiles recomputed)."""
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < N
    d_ok = offs_d < D
    q_rows = Q + b * stride_qb + h * stride_qh + offs_m * stride_qn
    do = tl.load(DO + b * stride_gb + h * stride_gh + offs_m[:, None] * stride_gn + offs_d[None, :],
                 mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    lse = tl.load(LSE + pid_bh * N + offs_m, mask=m_ok, other=0.0)
    delta = tl.load(DELTA + pid_bh * N + offs_m, mask=m_ok, other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    zero = dot_zeros(BLOCK_M, BLOCK_N)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        real = tl.load(MASK + b * stride_mb + offs_n, mask=n_ok, other=0) != 0
        k_rows = k_base + offs_n * stride_kn
        dist = l1_tile(zero, q_rows, k_rows, m_ok, n_ok, D)
        p = tl.where(real[None, :], tl.exp2(dist * score_scale - lse[:, None]), 0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        ds = p * (mm(do, tl.trans(v), F32_DOT, PRECISION) - delta[:, None])
        dq = _sign_sum(dq, ds, q_rows, k_rows, m_ok, n_ok, D, BLOCK_D)
    tl.store(DQ + pid_bh * N * D + offs_m[:, None] * D + offs_d[None, :], (dq * grad_scale).to(DQ.dtype.element_ty),
             mask=m_ok[:, None] & d_ok[None, :])
