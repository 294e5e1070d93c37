"""The kernels of Nyströmformer's landmarks: means of Q and K over segments of the real tokens.

Per sequence (and head), the real token of rank ``r`` (1-based, among the ``n_real`` real tokens, in order)
belongs to segment ``⌊(r − 1)·m / n_real⌋`` (:func:`attention.nystrom.segment_means`, the same decision)::

    Q̃_s = Σ_{t ∈ s} Q_t / c_s,   K̃_s = Σ_{t ∈ s} K_t / c_s,   c_s = |s|   (0 / 0 = 0: an empty segment)

``_segment_means_fwd``: one program per (batch, head) and group of ``SEGMENTS`` consecutive segments (grid
``(B·H, ⌈m / SEGMENTS⌉)``, :func:`kernels.segment_means.launch.segments_per_program`: enough programs for a GPU). Two
passes over the mask (``MASK_BLOCK`` flags a step, one byte each) count ``n_real`` and find the group's positions
``[lo, hi)``: segments ``[s₀, s₁)`` hold the ranks ``r`` with ``s₀·n_real ≤ (r − 1)·m < s₁·n_real``, so ``lo`` is the
number of positions whose running count of real tokens is below ``⌈s₀·n_real / m⌉ + 1`` (``hi`` likewise; the
first group starts at 0, the last ends at n, so the groups partition the positions, leading and trailing pads
included). A third pass goes through the group's positions in blocks of ``BLOCK_N`` tokens, ranks them (a running
``cumsum`` of the mask), and adds each block's rows to their segments' sums as one product ``onehotᵀ X``
(``BLOCK_M × BLOCK_N`` by ``BLOCK_N × BLOCK_D``, float32 IEEE dots). It writes the group's means, each segment's
count, its additive mask (0 if it holds a real token, else :data:`attention.paths.MASKED`) and validity, and each
of its positions' segment (−1 for pads) for the backward.
``_segment_means_bwd``: one program per block of tokens: ``dX_t = dX̃_{s(t)} / c_{s(t)}``, 0 on pads.
Launched by :mod:`kernels.segment_means.launch`. ``Q, K`` and the token gradients ``dQ, dK`` (n-sized) are float32,
bf16 or fp16 (the inputs' dtype); the sums, means and their gradients (m-sized) are float32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common.launch import mm


@triton.jit
def _segment_means_fwd(
    Q, K, MASK, QL, KL, COUNT, SLOTS, VALID, SEG,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_mb,
    H, n, d, m, SEGMENTS, masked,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, MASK_BLOCK: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    bh = tl.program_id(0)
    b, h = bh // H, bh % H
    first = tl.program_id(1) * SEGMENTS  # this program's segments: [first, last)
    last = tl.minimum(first + SEGMENTS, m)
    flags = tl.arange(0, MASK_BLOCK)
    total = tl.zeros([MASK_BLOCK], tl.int32)
    for start in range(0, n, MASK_BLOCK):
        total += tl.load(MASK + b * stride_mb + start + flags, mask=start + flags < n, other=0).to(tl.int32)
    n_real = tl.maximum(tl.sum(total, 0), 1)
    # ranks r of segments [first, last): first·n_real ≤ (r − 1)·m < last·n_real; their tokens (and the pads after
    # them) are the positions whose running count of real tokens is in [rank_lo, rank_hi)
    rank_lo = (first * n_real + m - 1) // m + 1
    rank_hi = (last * n_real + m - 1) // m + 1
    lo = n_real * 0
    hi = n_real * 0
    seen = n_real * 0
    for start in range(0, n, MASK_BLOCK):
        real = tl.load(MASK + b * stride_mb + start + flags, mask=start + flags < n, other=0).to(tl.int32)
        running = tl.cumsum(real, 0) + seen
        inside = start + flags < n
        lo += tl.sum((inside & (running < rank_lo)).to(tl.int32), 0)
        hi += tl.sum((inside & (running < rank_hi)).to(tl.int32), 0)
        seen += tl.sum(real, 0)
    lo = tl.where(first == 0, 0, lo)  # the leading pads (segment −1) go to the first program, the trailing to the last
    hi = tl.where(last == m, n, hi)
    tokens = tl.arange(0, BLOCK_N)
    slots = tl.arange(0, BLOCK_M)  # this program's segments, from first
    cols = tl.arange(0, BLOCK_D)
    sum_q = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    sum_k = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    count = tl.zeros([BLOCK_M], tl.float32)
    before = tl.minimum(rank_lo - 1, n_real)  # real tokens before position lo
    q_base = Q + b * stride_qb + h * stride_qh + lo * stride_qn
    k_base = K + b * stride_kb + h * stride_kh + lo * stride_kn
    mask_base = MASK + b * stride_mb + lo
    seg_base = SEG + bh * n + lo
    for start in range(0, hi - lo, BLOCK_N):
        rows = start + tokens  # from lo
        inside = rows < hi - lo
        real = tl.load(mask_base + rows, mask=inside, other=0).to(tl.int32)
        rank = tl.cumsum(real, 0) + before  # 1-based ranks of the real tokens
        segment = tl.where(real > 0, ((rank - 1) * m) // n_real, -1)
        tl.store(seg_base + rows, segment, mask=inside)
        onehot = ((segment - first)[None, :] == slots[:, None]).to(tl.float32)  # (BLOCK_M, BLOCK_N)
        take = (real > 0)[:, None] & (cols[None, :] < d)  # pads read as 0 whatever they hold
        q = tl.load(q_base + rows[:, None] * stride_qn + cols[None, :], mask=take, other=0.0)
        k = tl.load(k_base + rows[:, None] * stride_kn + cols[None, :], mask=take, other=0.0)
        sum_q += mm(onehot, q, F32_DOT, PRECISION)
        sum_k += mm(onehot, k, F32_DOT, PRECISION)
        count += tl.sum(onehot, 1)
        before += tl.sum(real, 0)
    slots += first
    scale = 1.0 / tl.maximum(count, 1.0)
    out = bh * m * d + slots[:, None] * d + cols[None, :]
    mine = slots < last
    keep = mine[:, None] & (cols[None, :] < d)
    tl.store(QL + out, sum_q * scale[:, None], mask=keep)
    tl.store(KL + out, sum_k * scale[:, None], mask=keep)
    tl.store(COUNT + bh * m + slots, count, mask=mine)
    tl.store(SLOTS + bh * m + slots, tl.where(count > 0, 0.0, masked), mask=mine)
    tl.store(VALID + bh * m + slots, (count > 0).to(tl.uint8), mask=mine)
