"""Launch parameters of the landmark kernels (:mod:`kernels.landmarks.segments`) and the functions that launch them.

:func:`launch_config` gives, for a kernel and a shape, every compile-time parameter: ``BLOCK_M = max(16,
next_pow2(m))`` slots and ``BLOCK_D = max(16, next_pow2(d))`` columns held by one program, ``BLOCK_N`` tokens per
step, the warps. The forward holds two ``BLOCK_M × BLOCK_D`` float32 sums and a ``BLOCK_M × BLOCK_N`` one-hot tile
in registers: :func:`takes` admits the shapes whose tiles ``tests/test_landmark_kernels.py`` compiles for sm_80 and
sm_90 without spills (``BLOCK_M · BLOCK_D ≤ 8192``: m ≤ 128 with d ≤ 64, m ≤ 64 with d ≤ 128); the others take the
attention-call form (:func:`attention.landmark_means.fused_segment_means`). Float32 only, any strides with a unit last
stride. :func:`segment_means_forward` and :func:`segment_means_backward` allocate and launch.
"""

from __future__ import annotations

import torch
import triton

from kernels.common import launch as common
from kernels.common.launch import MIN_DOT, LaunchConfig
from kernels.landmarks import segments

POINTER_TYPES = {
    "_segment_means_fwd": {"Q": "*fp32", "K": "*fp32", "MASK": "*u8", "QL": "*fp32", "KL": "*fp32", "COUNT": "*fp32",
                           "SLOTS": "*fp32", "VALID": "*u8", "SEG": "*i32"},
    "_segment_means_bwd": {"DQL": "*fp32", "DKL": "*fp32", "COUNT": "*fp32", "SEG": "*i32", "DQ": "*fp32", "DK": "*fp32"},
}
KERNELS = tuple(POINTER_TYPES)
FLOAT_ARGS = ("masked",)
MAX_TILE = 8192  # BLOCK_M · BLOCK_D of the forward's sums that compile without spills (module doc)


def tiles(m: int, d: int) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_D)`` for ``m`` segments of ``d`` columns."""
    return max(MIN_DOT, triton.next_power_of_2(m)), max(MIN_DOT, triton.next_power_of_2(d))


def takes(x: torch.Tensor, m: int) -> bool:
    """Whether the kernels take the landmarks of ``x`` ``(B, H, n, d)`` in ``m`` segments (float32; tiles in
    :data:`MAX_TILE`)."""
    block_m, block_d = tiles(m, x.shape[-1])
    return x.dtype == torch.float32 and block_m * block_d <= MAX_TILE


def launch_config(kernel: str, m: int, d: int) -> LaunchConfig:
    """Every compile-time parameter of launching ``kernel`` for ``m`` segments of ``d`` columns."""
    block_m, block_d = tiles(m, d)
    if kernel == "_segment_means_fwd":
        dots = common.dot_constexprs(torch.float32, tf32=False)  # IEEE float32 sums: the means, not an estimate
        # 16 tokens a step, 8 warps past 1024 sum elements, one stage: measured by compiling for sm_80 and sm_90
        # (tests/test_landmark_kernels.py), what spills nothing anywhere (32 tokens spill from 64 × 64 sums on, 4 warps
        # from 64 × 64, two stages at 32 × 128 and 128 × 32 on sm_90)
        return LaunchConfig({"BLOCK_N": 16, "BLOCK_M": block_m, "BLOCK_D": block_d, **dots},
                            num_warps=4 if block_m * block_d <= 1024 else 8, num_stages=1)
    # two BLOCK_N × BLOCK_D float32 tiles a program: 64 × 128 spills on sm_90, 32 × 128 does not
    return LaunchConfig({"BLOCK_N": min(64, 4096 // block_d), "BLOCK_D": block_d}, num_warps=4, num_stages=1)


def pointer_types(kernel: str) -> dict[str, str]:
    """Triton pointer types of ``kernel``'s tensor arguments (what the AOT test compiles)."""
    return dict(POINTER_TYPES[kernel])


def launch(kernel: str, grid, cfg: LaunchConfig, *args) -> None:
    """``kernel[grid](*args, **cfg.options)``, the pointer types checked under the interpreter."""
    common.launch(getattr(segments, kernel), grid, cfg, POINTER_TYPES[kernel], *args)


def segment_means_forward(q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor, m: int, masked: float):
    """``(Q̃, K̃, counts, slot mask, valid, segment)`` of float32 ``q, k`` ``(B, H, n, d)`` (unit last stride) and bool
    ``key_mask`` ``(B, n)`` (unit last stride): means ``(B, H, m, d)``, counts and additive slot mask (0, or
    ``masked`` for an empty segment) float32 ``(B, H, m)``, validity bool ``(B, H, m)``, each token's segment int32
    ``(B, H, n)`` (−1 on pads)."""
    batch, heads, n, d = q.shape
    cfg = launch_config("_segment_means_fwd", m, d)
    q_land, k_land = (q.new_empty(batch, heads, m, d) for _ in range(2))
    counts, slots = (q.new_empty(batch, heads, m) for _ in range(2))
    valid = torch.empty(batch, heads, m, dtype=torch.uint8, device=q.device)
    segment = torch.empty(batch, heads, n, dtype=torch.int32, device=q.device)
    mask = key_mask.view(torch.uint8)
    launch("_segment_means_fwd", (batch * heads,), cfg, q, k, mask, q_land, k_land, counts, slots, valid, segment,
           *q.stride()[:3], *k.stride()[:3], mask.stride(0), heads, n, d, m, masked)
    return q_land, k_land, counts, slots, valid.view(torch.bool), segment


def segment_means_backward(d_q_land: torch.Tensor, d_k_land: torch.Tensor, counts: torch.Tensor,
                           segment: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dQ, dK)`` float32 ``(B, H, n, d)`` from the means' gradients (any strides with a unit last one) and the
    forward's counts and segments."""
    batch, heads, m, d = d_q_land.shape
    n = segment.shape[-1]
    cfg = launch_config("_segment_means_bwd", m, d)
    dq, dk = (d_q_land.new_empty(batch, heads, n, d) for _ in range(2))
    launch("_segment_means_bwd", (batch * heads, triton.cdiv(n, cfg.constexprs["BLOCK_N"])), cfg,
           d_q_land, d_k_land, counts, segment, dq, dk, *d_q_land.stride()[:3], *d_k_land.stride()[:3],
           *dq.stride()[:3], heads, n, d, m)
    return dq, dk
