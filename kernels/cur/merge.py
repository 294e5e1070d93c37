"""The merge of ``_rv_fwd``'s per-split partials (:mod:`kernels.cur.run`) as one kernel, where it took eight PyTorch
ops (a max, a subtraction, an exponential, a sum, a division, a product over S, a logarithm, an addition), eight
launches of a few microseconds each on a GPU.

From the normalised partials ``RV_s`` ``(B, H, S, m, d)`` and base-2 log-sum-exps ``lse_s`` ``(B, H, S, m)`` of the
``S`` splits of the keys, per row::

    top = max_s lse_s,   w_s = 2^(lse_s − top),   total = Σ_s w_s
    lse = top + log2 total,   RV = Σ_s w_s RV_s / total

A split without a real key has ``lse_s = −1e30`` and ``RV_s = 0``: weight 0 beside any split that has one. One
program per batch row × head and ``BLOCK_M`` rows, two passes over the splits (the maximum, then the weighted
sum), float32 throughout; no dot, so no tensor-core constraint on its tiles. Every launch parameter depends on ``d``
only (:func:`launch_config`); ``tests/kernels/test_flashcur.py`` compiles it for sm_80 and sm_90 at every head dim
FlashCUR takes, and the split tests of ``tests/kernels/test_flashcur_kernels.py`` check its numbers against float64
autograd (a split without a real key included).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.common import aot
from kernels.common import launch as common
from kernels.common.launch import LaunchConfig

BLOCK_M = 16  # rows a program merges: at B 8, H 2, m 64, 64 programs
POINTER_TYPES = {"RV_PARTS": "*fp32", "LSE_PARTS": "*fp32", "RV": "*fp32", "LSE": "*fp32"}


@triton.jit
def _merge_splits(RV_PARTS, LSE_PARTS, RV, LSE, S, M, D, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program: rows ``program_id(1)·BLOCK_M …`` of batch row × head ``program_id(0)``."""
    bh = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < M
    lse_parts = LSE_PARTS + bh * S * M + rows
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in range(S):
        top = tl.maximum(top, tl.load(lse_parts + s * M, mask=row_ok, other=0.0))
    tile = rows[:, None] * D + cols[None, :]
    inside = row_ok[:, None] & (cols[None, :] < D)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for s in range(S):
        weight = tl.exp2(tl.load(lse_parts + s * M, mask=row_ok, other=0.0) - top)
        total += weight
        acc += weight[:, None] * tl.load(RV_PARTS + (bh * S + s) * M * D + tile, mask=inside, other=0.0)
    tl.store(RV + bh * M * D + tile, acc / total[:, None], mask=inside)
    tl.store(LSE + bh * M + rows, top + tl.log2(total), mask=row_ok)


@functools.lru_cache(maxsize=None)
def launch_config(d: int) -> LaunchConfig:
    """``BLOCK_M`` rows by the head dim's power of two; 4 warps (a 16 × 128 float32 accumulator is 16 registers a
    thread)."""
    return LaunchConfig({"BLOCK_M": BLOCK_M, "BLOCK_D": max(16, triton.next_power_of_2(d))}, num_warps=4, num_stages=1)


def merge_splits(rv_parts: torch.Tensor, lse_parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(RV, lse)`` ``(B, H, m, d)``, ``(B, H, m)`` float32 from ``rv_parts`` ``(B, H, S, m, d)`` and ``lse_parts``
    ``(B, H, S, m)`` float32, contiguous (module doc)."""
    batch, heads, parts, m, d = rv_parts.shape
    rv = rv_parts.new_empty(batch, heads, m, d)
    lse = lse_parts.new_empty(batch, heads, m)
    common.launch(_merge_splits, (batch * heads, triton.cdiv(m, BLOCK_M)), launch_config(d), POINTER_TYPES,
                  rv_parts, lse_parts, rv, lse, parts, m, d, loop=("splits", parts))
    return rv, lse


def compile_kernel(capability: int, d: int) -> aot.Compiled:
    """AOT-compile the merge for ``sm_<capability>`` with the launch parameters for head dim ``d``."""
    return aot.compile_jit(_merge_splits, capability, launch_config(d), POINTER_TYPES, (), name="_merge_splits")
