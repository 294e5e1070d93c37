"""FlashL1 forward kernel (EcoTransformer, Gao & Xu 2025, eq. 1), and the distance tiles the backward shares.

Per (batch, head), with ``q, k, v`` ``(n, d)``, λ > 0 and the key pad mask::

    S_ij = −λ ‖q_i − k_j‖₁ / √d   (−inf on pad keys),   P = softmax_j(S),   Y = P V   (n × d)

``_l1_fwd``: one program per tile of ``BLOCK_M`` queries, online softmax over tiles of ``BLOCK_N`` keys
(flash attention): with the running max ``m``, sum ``l`` and output ``acc``, per key tile
``m' = max(m, rowmax S)``, ``α = exp(m − m')``, ``l ← α l + rowsum e^{S−m'}``, ``acc ← α acc + e^{S−m'} V``;
finally ``Y = acc / l`` and the row log-sum-exp ``L = m + log l`` is stored (base 2). The distance tile
is accumulated in float32 one column of ``d`` at a time (:func:`l1_tile`: an L1 distance is no matmul),
in the ``tl.dot`` accumulator layout (:func:`dot_zeros`); ``P V`` is a ``tl.dot``. Nothing n × n is
stored. Launched by :func:`kernels.l1.launch.l1_forward`; layouts, dtypes and masking there.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common.launch import mm


@triton.jit
def dot_zeros(BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr):
    """A float32 ``(BLOCK_A, BLOCK_B)`` zero tile in the ``tl.dot`` accumulator layout (it is a dot of zeros).

    Accumulating the distances in that layout gives each thread a small block of rows × columns (so
    few loads per column of ``d``) and feeds ``P`` to the next dot without a layout conversion.
    """
    return tl.dot(tl.zeros([BLOCK_A, 16], tl.float16), tl.zeros([16, BLOCK_B], tl.float16))


@triton.jit
def l1_tile(zero, a_rows, b_rows, a_ok, b_ok, D):
    """``zero + ‖a_i − b_j‖₁`` float32 ``(A, B)``; ``a_rows, b_rows`` point at the rows' first elements."""
    dist = zero
    for c in range(0, D):
        a = tl.load(a_rows + c, mask=a_ok, other=0.0).to(tl.float32)
        b = tl.load(b_rows + c, mask=b_ok, other=0.0).to(tl.float32)
        dist += tl.abs(a[:, None] - b[None, :])
    return dist


@triton.jit
def _l1_fwd(
    Q, K, V, MASK, OUT, LSE,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on, stride_mb,
    H, N, D, score_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: BLOCK_M queries of one (batch, head); online softmax over key tiles (base 2)."""
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < N
    d_ok = offs_d < D
    q_rows = Q + b * stride_qb + h * stride_qh + offs_m * stride_qn
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    zero = dot_zeros(BLOCK_M, BLOCK_N)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        real = tl.load(MASK + b * stride_mb + offs_n, mask=n_ok, other=0) != 0
        dist = l1_tile(zero, q_rows, k_base + offs_n * stride_kn, m_ok, n_ok, D)
        scores = tl.where(real[None, :], dist * score_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + mm(p, v, F32_DOT, PRECISION)
        m_i = m_new
    safe_l = tl.where(l_i > 0, l_i, 1.0)
    out = acc / safe_l[:, None]
    out_ptrs = OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :]
    tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
    tl.store(LSE + pid_bh * N + offs_m, tl.where(l_i > 0, m_i + tl.log2(safe_l), float("inf")), mask=m_ok)
