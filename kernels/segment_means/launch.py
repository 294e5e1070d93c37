"""Launch parameters of the landmark kernels (:mod:`kernels.segment_means.forward`,
:mod:`kernels.segment_means.backward`) and the functions that launch them.

:func:`launch_config` gives, for a kernel and a shape, every compile-time parameter: ``BLOCK_M = max(16,
next_pow2(segments))`` slots (the forward's ``segments`` per program, :func:`segments_per_program`) and ``BLOCK_D =
max(16, next_pow2(d))`` columns held by one program, ``BLOCK_N`` tokens per step, the warps; memoised per shape. The
forward spreads each (batch, head) over groups of segments, grid ``(B·H, ⌈m / segments⌉)``, so that a launch has
at least :data:`TARGET_PROGRAMS` programs (two waves on an H100 / H200) where ``B·H`` alone would leave most of the
GPU idle (16 programs at B 8, H 2). It holds two ``BLOCK_M × BLOCK_D`` float32 sums and a ``BLOCK_M × BLOCK_N``
one-hot tile in registers, at most 64 × 64 or 32 × 128 (:func:`group_limit`; ``tests/kernels/test_segment_means.py``
compiles every tile for sm_80 and sm_90 without spills); :func:`takes` admits ``BLOCK_M · BLOCK_D ≤ 8192`` for all m
segments (m ≤ 128 with d ≤ 64, m ≤ 64 with d ≤ 128, the shapes the kernels took in one program before the groups);
the others take the attention-call form
(:func:`attention.landmark_means.fused_segment_means`). ``q, k`` and their gradients (n-sized) in float32, bf16 or
fp16 (:data:`IN`, the inputs' dtype), the means, counts and masks (m-sized) float32; any strides with a unit last
stride.
:func:`segment_means_forward` and :func:`segment_means_backward` allocate and launch.
"""

from __future__ import annotations

import functools

import torch
import triton

from kernels.common import launch as common
from kernels.common.launch import IN, MIN_DOT, LaunchConfig
from kernels.segment_means import backward, forward

POINTER_TYPES = {
    "_segment_means_fwd": {"Q": IN, "K": IN, "MASK": "*u8", "QL": "*fp32", "KL": "*fp32", "COUNT": "*fp32",
                           "SLOTS": "*fp32", "VALID": "*u8", "SEG": "*i32"},
    "_segment_means_bwd": {"DQ": IN, "DK": IN, "DQL": "*fp32", "DKL": "*fp32", "COUNT": "*fp32", "SEG": "*i32"},
}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KERNELS = tuple(POINTER_TYPES)
FLOAT_ARGS = ("masked",)
MAX_TILE = 8192  # BLOCK_M · BLOCK_D of the forward's sums that compile without spills (module doc)
TARGET_PROGRAMS = common.TWO_WAVES  # programs the forward aims for: two waves on an H100 / H200
MASK_BLOCK = 1024  # mask flags (bytes) the forward's counting passes read a step


def tiles(m: int, d: int) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_D)`` for ``m`` segments of ``d`` columns."""
    return max(MIN_DOT, triton.next_power_of_2(m)), max(MIN_DOT, triton.next_power_of_2(d))


def takes(x: torch.Tensor, m: int) -> bool:
    """Whether the kernels take the landmarks of ``x`` ``(B, H, n, d)`` in ``m`` segments (float32, bf16, fp16; tiles
    in :data:`MAX_TILE`)."""
    block_m, block_d = tiles(m, x.shape[-1])
    return x.dtype in DTYPES and block_m * block_d <= MAX_TILE


def group_limit(d: int) -> int:
    """The most segments one forward program sums: ``BLOCK_M ≤ 64`` and ``BLOCK_M · BLOCK_D ≤ 4096`` (larger groups,
    128 × 16 to 128 × 64, spill 8–168 B on sm_80 / sm_90 with the group search; measured by
    ``tests/kernels/test_segment_means.py``)."""
    return min(64, max(MIN_DOT, 4096 // tiles(1, d)[1]))


@functools.lru_cache(maxsize=None)
def segments_per_program(batch_heads: int, m: int, d: int, target: int = TARGET_PROGRAMS) -> int:
    """Segments one forward program sums: the most that still gives ``batch_heads · ⌈m / segments⌉ ≥ target``
    programs (``⌊m / ⌈target / batch_heads⌉⌋``, at least 1; all m once ``batch_heads ≥ target``), at most
    :func:`group_limit`. At B·H 16, m 64: 3 segments a program, 22 groups, 352 programs."""
    return min(max(1, m // triton.cdiv(target, batch_heads)), group_limit(d))


@functools.lru_cache(maxsize=None)
def launch_config(kernel: str, m: int, d: int, segments: int | None = None) -> LaunchConfig:
    """Every compile-time parameter of launching ``kernel`` for ``m`` segments of ``d`` columns, the forward's
    programs summing ``segments`` of them each (default the most a program takes, :func:`group_limit`: the
    largest tiles). Memoised per shape."""
    block_m, block_d = tiles(min(m, segments or group_limit(d)), d)
    if kernel == "_segment_means_fwd":
        dots = common.dot_constexprs(torch.float32, tf32=False)  # IEEE float32 sums: the means, not an estimate
        # 16 tokens a step, 8 warps from 4096 sum elements, one stage: measured by compiling for sm_80 and sm_90 in
        # float32 and bf16 (tests/kernels/test_segment_means.py), what spills nothing anywhere (4 warps spill at 64 × 64;
        # 8 warps at 16 × 64, 32 × 64, 64 × 16; 32 tokens from 64 × 64 sums on, two stages at 32 × 128)
        return LaunchConfig({"BLOCK_N": 16, "BLOCK_M": block_m, "BLOCK_D": block_d, "MASK_BLOCK": MASK_BLOCK, **dots},
                            num_warps=8 if block_m * block_d >= 4096 else 4, num_stages=1)
    # two BLOCK_N × BLOCK_D float32 tiles a program: 64 × 128 spills on sm_90, 32 × 128 does not
    return LaunchConfig({"BLOCK_N": min(64, 4096 // block_d), "BLOCK_D": block_d}, num_warps=4, num_stages=1)


def pointer_types(kernel: str, dtype: torch.dtype = torch.float32) -> dict[str, str]:
    """Triton pointer types of ``kernel``'s tensor arguments for inputs of ``dtype`` (what the AOT test compiles)."""
    return common.pointer_types(POINTER_TYPES[kernel], dtype)


def launch(kernel: str, grid, cfg: LaunchConfig, *args, loop: tuple[str, int]) -> None:
    """``kernel[grid](*args, **cfg.options)``, the pointer types checked under the interpreter; ``loop``: what a
    program walks and how many steps (:func:`kernels.common.launch.launch`, kept by its ``recording``)."""
    common.launch(kernel_function(kernel), grid, cfg, POINTER_TYPES[kernel], *args, loop=loop)


def segment_means_forward(q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor, m: int, masked: float):
    """``(Q̃, K̃, counts, slot mask, valid, segment)`` of ``q, k`` ``(B, H, n, d)`` (one of :data:`DTYPES`, unit last
    stride) and bool
    ``key_mask`` ``(B, n)`` (unit last stride): means ``(B, H, m, d)``, counts and additive slot mask (0, or
    ``masked`` for an empty segment) float32 ``(B, H, m)``, validity bool ``(B, H, m)``, each token's segment int32
    ``(B, H, n)`` (−1 on pads)."""
    batch, heads, n, d = q.shape
    per = segments_per_program(batch * heads, m, d, TARGET_PROGRAMS)
    groups = triton.cdiv(m, per)
    cfg = launch_config("_segment_means_fwd", m, d, per)
    q_land, k_land = (q.new_empty(batch, heads, m, d, dtype=torch.float32) for _ in range(2))
    counts, slots = (q.new_empty(batch, heads, m, dtype=torch.float32) for _ in range(2))
    valid = torch.empty(batch, heads, m, dtype=torch.uint8, device=q.device)
    segment = torch.empty(batch, heads, n, dtype=torch.int32, device=q.device)
    mask = key_mask.view(torch.uint8)
    # per program: two passes over the mask, then its group's tokens (n / groups when all are real)
    steps = 2 * triton.cdiv(n, MASK_BLOCK) + triton.cdiv(triton.cdiv(n, groups), cfg.constexprs["BLOCK_N"])
    launch("_segment_means_fwd", (batch * heads, groups), cfg, q, k, mask, q_land, k_land, counts, slots, valid,
           segment, *q.stride()[:3], *k.stride()[:3], mask.stride(0), heads, n, d, m, per, masked, loop=("tokens", steps))
    return q_land, k_land, counts, slots, valid.view(torch.bool), segment


def segment_means_backward(d_q_land: torch.Tensor, d_k_land: torch.Tensor, counts: torch.Tensor,
                           segment: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dQ, dK)`` ``(B, H, n, d)`` in ``dtype`` (the inputs') from the means' float32 gradients (any strides with a
    unit last one) and the forward's counts and segments."""
    batch, heads, m, d = d_q_land.shape
    n = segment.shape[-1]
    cfg = launch_config("_segment_means_bwd", m, d)
    dq, dk = (d_q_land.new_empty(batch, heads, n, d, dtype=dtype) for _ in range(2))
    launch("_segment_means_bwd", (batch * heads, triton.cdiv(n, cfg.constexprs["BLOCK_N"])), cfg,
           dq, dk, d_q_land, d_k_land, counts, segment, *d_q_land.stride()[:3], *d_k_land.stride()[:3],
           *dq.stride()[:3], heads, n, d, m, loop=("none", 1))
    return dq, dk


def kernel_function(kernel: str):
    """The ``@triton.jit`` function named ``kernel`` (:mod:`kernels.segment_means.forward` or ``.backward``)."""
    return getattr(forward, kernel, None) or getattr(backward, kernel)
