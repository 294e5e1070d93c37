"""The backward kernel of Nyströmformer's landmarks (the forward, its segments and its equations:
:mod:`kernels.segment_means.forward`): ``dX_t = dX̃_{s(t)} / c_{s(t)}`` for each real token ``t`` of segment
``s(t)``, 0 on pads, one program per block of ``BLOCK_N`` tokens of a (batch, head). Launched by
:mod:`kernels.segment_means.launch`; ``dQ, dK`` in the inputs' dtype, the means' gradients float32."""

from __future__ import annotations

import triton
import triton.language as tl

import kernels.common.launch  # noqa: F401  (first: it decides whether Triton interprets the kernel)


@triton.jit
def _segment_means_bwd(
    DQ, DK, DQL, DKL, COUNT, SEG,
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
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=write)
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=write)
