"""The kernels of Nyströmformer's landmarks: means of Q and K over segments of the real tokens.

Per sequence (and head), the real token of rank ``r`` (1-based, among the ``n_real`` real tokens, in order)
belongs to segment ``⌊(r − 1)·m / n_real⌋`` (:func:`attention.nystrom.segment_means`, the same decision)::

    Q̃_s = Σ_{t ∈ s} Q_t / c_s,   K̃_s = Σ_{t ∈ s} K_t / c_s,   c_s = |s|   (0 / 0 = 0: an empty segment)

``_segment_means_fwd``: one program per (batch, head); a first pass over the mask counts ``n_real``, a second
goes through blocks of ``BLOCK_N`` tokens, ranks them (a running ``cumsum`` of the mask), and adds each block's
rows to their segments' sums as one product ``onehotᵀ X`` (``BLOCK_M × BLOCK_N`` by ``BLOCK_N × BLOCK_D``, float32
IEEE dots). It writes the means, each segment's count, its additive mask (0 if it holds a real token, else
:data:`attention.paths.MASKED`) and validity, and each token's segment (−1 for pads) for the backward.
``_segment_means_bwd``: one program per block of tokens: ``dX_t = dX̃_{s(t)} / c_{s(t)}``, 0 on pads.
Launched by :mod:`kernels.landmarks.launch`; float32 only (the landmarks run in float32).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common.launch import mm


@triton.jit
def _segment_means_fwd(
    Q, K, MASK, QL, KL, COUNT, SLOTS, VALID, SEG,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_mb,
    H, n, d, m, masked,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, F32_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    bh = tl.program_id(0)
    b, h = bh // H, bh % H
    tokens = tl.arange(0, BLOCK_N)
    slots = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    total = tl.zeros([BLOCK_N], tl.int32)
    for start in range(0, n, BLOCK_N):
        total += tl.load(MASK + b * stride_mb + start + tokens, mask=start + tokens < n, other=0).to(tl.int32)
    n_real = tl.maximum(tl.sum(total, 0), 1)
    sum_q = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    sum_k = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    count = tl.zeros([BLOCK_M], tl.float32)
    before = n_real * 0  # real tokens before this block (an int32 scalar, as the loop keeps it)
    for start in range(0, n, BLOCK_N):
        rows = start + tokens
        inside = rows < n
        real = tl.load(MASK + b * stride_mb + rows, mask=inside, other=0).to(tl.int32)
        rank = tl.cumsum(real, 0) + before  # 1-based ranks of the real tokens
        segment = tl.where(real > 0, ((rank - 1) * m) // n_real, -1)
        tl.store(SEG + bh * n + rows, segment, mask=inside)
        onehot = (segment[None, :] == slots[:, None]).to(tl.float32)  # (BLOCK_M, BLOCK_N)
        take = (real > 0)[:, None] & (cols[None, :] < d)  # pads read as 0 whatever they hold
        q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn + cols[None, :], mask=take, other=0.0)
        k = tl.load(K + b * stride_kb + h * stride_kh + rows[:, None] * stride_kn + cols[None, :], mask=take, other=0.0)
        sum_q += mm(onehot, q, F32_DOT, PRECISION)
        sum_k += mm(onehot, k, F32_DOT, PRECISION)
        count += tl.sum(onehot, 1)
        before += tl.sum(real, 0)
    scale = 1.0 / tl.maximum(count, 1.0)
    out = bh * m * d + slots[:, None] * d + cols[None, :]
    keep = (slots[:, None] < m) & (cols[None, :] < d)
    tl.store(QL + out, sum_q * scale[:, None], mask=keep)
    tl.store(KL + out, sum_k * scale[:, None], mask=keep)
    tl.store(COUNT + bh * m + slots, count, mask=slots < m)
    tl.store(SLOTS + bh * m + slots, tl.where(count > 0, 0.0, masked), mask=slots < m)
    tl.store(VALID + bh * m + slots, (count > 0).to(tl.uint8), mask=slots < m)


@triton.jit
def _segment_means_bwd(
    DQL, DKL, COUNT, SEG, DQ, DK,
    stride_ab, stride_ah, stride_as, stride_cb, stride_ch, stride_cs, stride_qb, stride_qh, stride_qn,
    H, n, d, m,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    bh = tl.program_id(0)
    b, h = bh // H, bh % H
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    inside = rows < n
    segment = tl.load(SEG + bh * n + rows, mask=inside, other=-1)
    real = segment >= 0
    scale = 1.0 / tl.load(COUNT + bh * m + segment, mask=real, other=1.0)
    take = real[:, None] & (cols[None, :] < d)
    at = segment[:, None] * stride_as + cols[None, :]
    dq = tl.load(DQL + b * stride_ab + h * stride_ah + at, mask=take, other=0.0) * scale[:, None]
    at = segment[:, None] * stride_cs + cols[None, :]
    dk = tl.load(DKL + b * stride_cb + h * stride_ch + at, mask=take, other=0.0) * scale[:, None]
    out = b * stride_qb + h * stride_qh + rows[:, None] * stride_qn + cols[None, :]
    write = inside[:, None] & (cols[None, :] < d)
    tl.store(DQ + out, dq, mask=write)
    tl.store(DK + out, dk, mask=write)
