"""FlashCUR forward kernels (François et al. 2025, §5.2, Alg. 2): three fused Triton kernels.

Per sequence and head (``d`` = head_dim, ``n`` tokens, ``m`` selected rows/columns, ``s = 1/√d``); the
Python functions that launch them are in :mod:`kernels.cur.run`:

* ``_rv_fwd`` (kernel a, :func:`~kernels.cur.run.rv_forward`): ``RV = softmax(s·Q_I Kᵀ + pad mask) V`` — flash attention (online
  softmax over key tiles) of the m selected query rows over all n keys; also returns the row
  log-sum-exp of ``R`` (base 2) for the backward. ``R`` (m×n) is never stored. The keys are split
  (flash-decoding's split-KV): grid ``(B·H, m / BLOCK_M, S)``, split ``s`` walks keys
  ``[s·SPLIT_N, (s+1)·SPLIT_N)`` and writes its normalised partial ``RV_s`` and ``lse_s``; the merge
  ``lse = log2 Σ_s 2^{lse_s}``, ``RV = Σ_s 2^{lse_s − lse} RV_s`` is exact (torch ops when ``S > 1``).
* ``_u_fwd`` (kernel b, :func:`~kernels.cur.run.u_forward`): ``U = softmax(s·Q_I K_Jᵀ)`` (m×m), equal to ``C[I, :]`` (§4.1).
* ``_out_fwd`` (kernel c, :func:`~kernels.cur.run.out_forward`): per query tile, ``Y = softmax(s·Q K_Jᵀ) W`` with ``W = U⁺ RV``
  (the m keys in chunks of BLOCK_M with an online softmax, like kernel a over its key tiles: the
  float32 product with ``W`` runs on FMA units, whose registers grow with its length), then rows
  ``I`` overwritten by ``RV``; also
  returns the row log-sum-exp of ``C`` (base 2). ``C`` (n×m) is never stored.

Layouts: ``q, k, v`` are ``(B, H, n, d)`` with a unit stride on ``d`` (any other strides); the small
tensors ``q_I, k_J`` (``(B, H, m, d)``), ``W, RV`` (``(B, H, m, d)`` float32) are contiguous.
Softmaxes run in base 2 (``exp2`` with ``s·log2 e``); all accumulation is float32. Inputs may be
float32, float16 or bfloat16. ``tl.dot`` operands are cast to float32 when the inputs are float32
or when running under ``TRITON_INTERPRET=1`` (the interpreter computes bf16 dots wrongly); with bf16 /
fp16 inputs every dot runs on tensor cores with operands in the input dtype, products with the float32
``W``, ``RV`` and probability tiles included (:func:`mm_in` casts them), float32 accumulation; every
``tl.dot`` operand is at least 16 in every dimension (:func:`kernels.cur.launch.block_sizes`
asserts it). Launch parameters (tiles, ``num_warps``, ``num_stages``, per GPU architecture and dtype)
come from :func:`kernels.cur.launch.launch_config`, which ``tests/kernels/test_aot_compile.py`` compiles
for sm_80 / sm_90 (shared memory within the limit, no register spills).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common.launch import mm


@triton.jit
def mm_in(a, b, like, F32_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """``a @ b`` with a float32 accumulator where an operand is float32 (``W``, ``RV``, their gradients, a
    probability tile): float32 operands when ``F32_DOT`` (float32 inputs, the interpreter), else both cast to
    ``like``'s dtype (the input dtype: bf16 / fp16 tensor-core operands)."""
    if F32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)
    return tl.dot(a.to(like.dtype), b.to(like.dtype))


@triton.jit
def _masked_softmax_tile(scores, valid):
    """Base-2 softmax of a ``(rows, M)`` tile over its columns ``valid`` (others 0) and its log-sum-exp.

    A row without any valid column is all 0 (never NaN), like :func:`attention.scores.masked_softmax`.
    """
    row_max = tl.max(tl.where(valid[None, :], scores, -1.0e30), 1)
    p = tl.where(valid[None, :], tl.exp2(scores - row_max[:, None]), 0.0)
    l = tl.sum(p, 1)
    safe_l = tl.where(l > 0, l, 1.0)
    return p / safe_l[:, None], row_max + tl.log2(safe_l)


@triton.jit
def _rv_fwd(
    QI, K, V, MASK, RV, LSE,
    stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_mb,
    H, N, D, M, SPLIT_N, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: BLOCK_M selected query rows of one (batch, head) over the keys of split ``program_id(2)``
    (``SPLIT_N`` keys, a multiple of BLOCK_N); online softmax over key tiles. Writes the split's normalised
    partial ``RV_s`` and log-sum-exp ``lse_s`` at ``[bh, s]`` of ``(B·H, S, M, ·)`` (merged in
    :func:`kernels.cur.run.rv_forward`; with one split they are ``RV`` and its lse)."""
    pid_bh = tl.program_id(0)
    split = tl.program_id(2)
    part = pid_bh * tl.num_programs(2) + split
    b = pid_bh // H
    h = pid_bh % H
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q = tl.load(QI + pid_bh * M * D + offs_m[:, None] * D + offs_d[None, :], mask=d_ok[None, :], other=0.0)
    lo = split * SPLIT_N  # this split's keys: [lo, min(lo + SPLIT_N, N))
    count = tl.minimum(SPLIT_N, N - lo)
    k_base = K + b * stride_kb + h * stride_kh + lo * stride_kn
    v_base = V + b * stride_vb + h * stride_vh + lo * stride_vn
    mask_base = MASK + b * stride_mb + lo
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, count, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < count
        tile_ok = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=tile_ok, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=tile_ok, other=0.0)
        real = tl.load(mask_base + offs_n, mask=n_ok, other=0) != 0
        scores = mm(q, tl.trans(k), F32_DOT, PRECISION) * qk_scale
        scores = tl.where(real[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + mm(p, v, F32_DOT, PRECISION)
        m_i = m_new
    safe_l = tl.where(l_i > 0, l_i, 1.0)
    out = acc / safe_l[:, None]
    tl.store(RV + part * M * D + offs_m[:, None] * D + offs_d[None, :], out, mask=d_ok[None, :])
    tl.store(LSE + part * M + offs_m, m_i + tl.log2(safe_l))


@triton.jit
def _u_fwd(
    QI, KJ, VALIDK, U, D, qk_scale,
    M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: BLOCK_M rows of ``U = softmax(s·Q_I K_Jᵀ)`` over all m selected keys."""
    pid_bh = tl.program_id(0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_j = tl.arange(0, M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < D
    q = tl.load(QI + pid_bh * M * D + offs_m[:, None] * D + offs_d[None, :], mask=d_ok, other=0.0)
    kj = tl.load(KJ + pid_bh * M * D + offs_j[:, None] * D + offs_d[None, :], mask=d_ok, other=0.0)
    valid = tl.load(VALIDK + pid_bh * M + offs_j) != 0
    p, _ = _masked_softmax_tile(mm(q, tl.trans(kj), F32_DOT, PRECISION) * qk_scale, valid)
    tl.store(U + pid_bh * M * M + offs_m[:, None] * M + offs_j[None, :], p)


@triton.jit
def _out_fwd(
    Q, KJ, VALIDK, W, RV, SLOT, OUT, LSE,
    stride_qb, stride_qh, stride_qn, stride_ob, stride_oh, stride_on,
    H, N, D, qk_scale,
    M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: a tile of BLOCK_N query rows; ``softmax(s·Q K_Jᵀ) W``, selected rows take ``RV``.

    The m keys are visited in chunks of BLOCK_M with an online softmax (one chunk when BLOCK_M = M):
    float32 dots run on FMA units, whose registers grow with the dot's K, so fp32 launches chunk m.
    """
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    n_ok = offs_n < N
    d_ok = offs_d < D
    tile_ok = n_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_n[:, None] * stride_qn + offs_d[None, :], mask=tile_ok, other=0.0)
    m_i = tl.full([BLOCK_N], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_N], tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for start in range(0, M, BLOCK_M):
        offs_j = start + tl.arange(0, BLOCK_M)
        small = pid_bh * M * D + offs_j[:, None] * D + offs_d[None, :]
        kj = tl.load(KJ + small, mask=d_ok[None, :], other=0.0)
        w = tl.load(W + small, mask=d_ok[None, :], other=0.0)
        valid = tl.load(VALIDK + pid_bh * M + offs_j) != 0
        scores = tl.where(valid[None, :], mm(q, tl.trans(kj), F32_DOT, PRECISION) * qk_scale, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.where(valid[None, :], tl.exp2(scores - m_new[:, None]), 0.0)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + mm_in(p, w, q, F32_DOT, PRECISION)
        m_i = m_new
    safe_l = tl.where(l_i > 0, l_i, 1.0)  # a row without any valid key is all 0 (never NaN)
    y = acc / safe_l[:, None]
    slot = tl.load(SLOT + pid_bh * N + offs_n, mask=n_ok, other=-1)
    chosen = slot >= 0
    rv = tl.load(RV + pid_bh * M * D + slot[:, None] * D + offs_d[None, :], mask=chosen[:, None] & d_ok[None, :], other=0.0)
    y = tl.where(chosen[:, None], rv, y)
    out_ptrs = OUT + b * stride_ob + h * stride_oh + offs_n[:, None] * stride_on + offs_d[None, :]
    tl.store(out_ptrs, y.to(OUT.dtype.element_ty), mask=tile_ok)
    tl.store(LSE + pid_bh * N + offs_n, m_i + tl.log2(safe_l), mask=n_ok)
