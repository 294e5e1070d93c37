"""FlashL1 launch parameters and launch functions: exact L1-distance attention (EcoTransformer, Gao & Xu 2025, eq. 1)
on the fused Triton kernels of :mod:`kernels.l1.forward` and :mod:`kernels.l1.backward`.

Per (batch, head), with ``q, k, v`` ``(n, d)``, λ > 0 and the key pad mask::

    S_ij = −λ ‖q_i − k_j‖₁ / √d   (−inf on pad keys),   P = softmax_j(S),   Y = P V   (n × d)

Here: the launch parameters per GPU architecture and dtype (:func:`launch_config`, compiled for
sm_80 / sm_90 by ``tests/kernels/test_flashl1.py``) and the functions that launch the kernels
(:func:`l1_forward`, :func:`l1_backward`). Their autograd wrapper and its checked entry point,
:func:`kernels.l1.ops.flash_l1_attention` (what :class:`attention.l1.L1Attention` calls on CUDA), are
:mod:`kernels.l1.ops`.

Masking follows :func:`attention.scores.masked_softmax`: pad keys get exactly 0 weight, and a row
with no real key (an all-pad sequence) outputs 0 (its ``L`` is +inf, so its ``P`` and gradients are 0).

Layouts: ``q, k, v`` ``(B, H, n, d)`` with a unit stride on ``d`` (any other strides), float32,
float16 or bfloat16 (all the same); ``key_mask`` bool ``(B, n)``, True = real token. Distances,
softmax and accumulators are float32; ``Y`` and the gradients have the inputs' dtype. ``tl.dot``
operands are float32 for float32 inputs (TF32 when torch allows it for CUDA matmuls) and under
``TRITON_INTERPRET=1``, else the input dtype. Any ``n`` ≥ 1 and ``1 ≤ d ≤ 128`` (tiles of
``BLOCK_D = max(16, next_pow2(d))`` columns, masked).
"""

from __future__ import annotations

import math

import torch
import triton

from kernels.common import launch as common
from kernels.common.launch import IN, MARGIN, MIN_DOT, TRITON_TYPES, LaunchConfig
from kernels.l1 import backward, forward

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 128
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

POINTER_TYPES = {
    "_l1_fwd": {"Q": IN, "K": IN, "V": IN, "MASK": "*u8", "OUT": IN, "LSE": "*fp32"},
    "_l1_bwd_kv": {"Q": IN, "K": IN, "V": IN, "MASK": "*u8", "DO": IN, "LSE": "*fp32", "DELTA": "*fp32", "DK": IN, "DV": IN},
    "_l1_bwd_q": {"Q": IN, "K": IN, "V": IN, "MASK": "*u8", "DO": IN, "LSE": "*fp32", "DELTA": "*fp32", "DQ": IN},
}
KERNELS = tuple(POINTER_TYPES)
FLOAT_ARGS = ("score_scale", "grad_scale")

# Tiles staged through shared memory, per kernel, as (rows, cols): "fixed" once per program (the first is
# the zero dot of forward.dot_zeros), "loop" once per iteration (pipelined: num_stages copies), "scratch" converted
# tiles. An over-count on purpose: Triton reuses buffers (tests/kernels/test_flashl1.py checks it never under-counts).
TILES = {
    "_l1_fwd": {"fixed": [("BLOCK_M", 16), (16, "BLOCK_N")], "loop": [("BLOCK_N", "BLOCK_D")],
                "scratch": [("BLOCK_M", "BLOCK_N")]},
    "_l1_bwd_kv": {"fixed": [(16, "BLOCK_M"), ("BLOCK_N", 16), ("BLOCK_N", "BLOCK_D")],
                   "loop": [("BLOCK_M", "BLOCK_D"), ("BLOCK_M", "BLOCK_DO")], "scratch": [("BLOCK_N", "BLOCK_M")]},
    "_l1_bwd_q": {"fixed": [("BLOCK_M", 16), (16, "BLOCK_N"), ("BLOCK_M", "BLOCK_D")], "loop": [("BLOCK_N", "BLOCK_D")],
                  "scratch": [("BLOCK_M", "BLOCK_N")]},
}


def check_head_dim(d: int) -> None:
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(
            f"FlashL1 supports attention head_dim 1..{MAX_HEAD_DIM}, got {d}: set model.d_model / model.num_heads "
            "so that their ratio is at most 128, or use attention=l1 (PyTorch)"
        )


def shared_memory_estimate(kernel: str, sizes: dict[str, int], num_stages: int, operand_bytes: int) -> int:
    """Bytes of shared memory ``kernel``'s staged tiles (:data:`TILES`) take at ``operand_bytes`` per element."""
    return common.shared_memory_estimate(TILES[kernel], sizes, num_stages, operand_bytes)


def tiles(kernel: str, block_d: int, dtype: torch.dtype, capability: int, tf32: bool) -> tuple[int, int, int, int]:
    """``(own rows, looped rows, num_warps, BLOCK_DO)`` before any limit on ``n`` or shared memory.

    Chosen by compiling for sm_80 / sm_90 (``tests/kernels/test_flashl1.py``) as the largest tiles without
    register spills: register pressure, not shared memory, is what binds (the distance tile, the float32
    accumulators, and float32 ``ieee`` dots on CUDA cores). ``own`` has ``16·num_warps`` rows (the dot
    layouts put all warps along it). ``_l1_bwd_kv`` splits its ``dK, dV`` columns over programs of
    ``BLOCK_DO`` columns where both accumulators would not fit.

    Float32 with ``ieee`` dots at ``BLOCK_D = 128`` on sm_90: both backward kernels take (16, 16) tiles
    and one warp, ``_l1_bwd_kv`` unsplit (``BLOCK_DO = 128``; 232 and ``_l1_bwd_q`` 178 registers, no stack). sm_90's
    ``ptxas`` spills (0.3-6 KB stack) with each larger tile, warp count or split tried (32-128 rows, 1-8
    warps, ``BLOCK_DO`` 16-64), at times allocating only 32 or 64 registers.
    """
    fp32, hopper = dtype == torch.float32, capability >= 90
    if kernel == "_l1_fwd":
        return 64, 32 if fp32 or block_d == 128 else 64, 4, block_d
    if fp32 and hopper and block_d == 128 and not tf32:  # backward, ieee dots with K = 128: see above
        return 16, 16, 1, block_d
    narrow = 32 if tf32 and block_d == 16 else 16  # float32: ptxas spills a few bytes with TF32 dots at (16, 16)
    if kernel == "_l1_bwd_q":
        if not fp32:
            return 64, 32, 4, block_d
        return (32, narrow, 2, block_d) if hopper and block_d >= 64 else (64, narrow, 4, block_d)
    if fp32:
        return 64, narrow, 4, min(block_d, 32)
    return 64, 32 if hopper and block_d <= 64 else 16, 4, block_d if hopper or block_d <= 32 else block_d // 2


def launch_config(kernel: str, n: int, d: int, dtype: torch.dtype, capability: int, tf32: bool = False,
                  interpreter: bool = False) -> LaunchConfig:
    """Every compile-time parameter of launching ``kernel`` on ``n`` tokens of head_dim ``d`` on ``sm_<capability>``.

    Tiles and warps from :func:`tiles`, both row tiles at most ``max(16, next_pow2(n))`` (and the warps
    with them); ``BLOCK_D = max(16, next_pow2(d))``. Stages: 3 on sm_90 and later, 2 before, fewer
    (then a smaller looped tile) while :func:`shared_memory_estimate` exceeds the architecture's opt-in
    limit less :data:`MARGIN`. ``_l1_bwd_kv`` owns keys (``BLOCK_N``) and loops over queries
    (``BLOCK_M``); the other two own queries and loop over keys.
    """
    check_head_dim(d)
    block_d = max(MIN_DOT, triton.next_power_of_2(d))
    fit = max(MIN_DOT, triton.next_power_of_2(n))
    own, loop, warps, block_do = tiles(kernel, block_d, dtype, capability, tf32 and dtype == torch.float32)
    own, loop = min(own, fit), min(loop, fit)
    dots = common.dot_constexprs(dtype, tf32, interpreter)  # interpreter: float32 dots
    limit = common.shared_memory_limit(capability) - MARGIN
    stages = 3 if capability >= 90 else 2
    while True:
        rows = {"BLOCK_M": loop, "BLOCK_N": own} if kernel == "_l1_bwd_kv" else {"BLOCK_M": own, "BLOCK_N": loop}
        sizes = {**rows, "BLOCK_D": block_d, **({"BLOCK_DO": block_do} if kernel == "_l1_bwd_kv" else {})}
        if shared_memory_estimate(kernel, sizes, stages, 4 if dots["F32_DOT"] else 2) <= limit:
            break
        if stages > 1:
            stages -= 1
        elif loop > MIN_DOT:
            loop //= 2
        else:
            raise ValueError(f"FlashL1 {kernel}: head_dim {d} in {TRITON_TYPES[dtype]} does not fit sm_{capability}")
    return LaunchConfig({**sizes, **dots}, num_warps=min(warps, own // 16), num_stages=stages)


def config(kernel: str, n: int, d: int, like: torch.Tensor) -> LaunchConfig:
    """:func:`launch_config` for inputs like ``like`` on their device (TF32 as torch allows; CPU counts as sm_80)."""
    capability = common.device_capability(like.device)
    return launch_config(kernel, n, d, like.dtype, capability, tf32=torch.backends.cuda.matmul.allow_tf32,
                         interpreter=common.runs_interpreted(like.device))


def kernel_function(kernel: str):
    """The ``@triton.jit`` function named ``kernel`` (:mod:`kernels.l1.forward` or ``.backward``)."""
    return getattr(forward, kernel, None) or getattr(backward, kernel)


def pointer_types(kernel: str, dtype: torch.dtype) -> dict[str, str]:
    """Triton pointer types of ``kernel``'s tensor arguments for inputs of ``dtype`` (what the AOT test compiles)."""
    return common.pointer_types(POINTER_TYPES[kernel], dtype)


def launch(kernel: str, grid, cfg: LaunchConfig, *args, loop: tuple[str, int]) -> None:
    """``kernel[grid](*args, **cfg.options)``; under the interpreter the tensors' types are checked
    against :data:`POINTER_TYPES` first, so the AOT-compiled signature is the launched one (``loop``: what each
    program walks, for the launch plan, :func:`kernels.common.launch.launch`)."""
    common.launch(kernel_function(kernel), grid, cfg, POINTER_TYPES[kernel], *args, loop=loop)


def unit_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def l1_forward(q, k, v, key_mask, lam: float):
    """``Y`` ``(B, H, n, d)`` in the inputs' dtype and the base-2 row log-sum-exp ``L`` float32 ``(B, H, n)``."""
    B, H, n, d = q.shape
    cfg = config("_l1_fwd", n, d, q)
    out = torch.empty(B, H, n, d, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, H, n, device=q.device, dtype=torch.float32)
    mask = key_mask.to(torch.uint8)
    launch(
        "_l1_fwd", (B * H, triton.cdiv(n, cfg.constexprs["BLOCK_M"])), cfg,
        q, k, v, mask, out, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], mask.stride(0),
        H, n, d, -lam * LOG2E / math.sqrt(d), loop=("keys", triton.cdiv(n, cfg.constexprs["BLOCK_N"])),
    )
    return out, lse


def l1_backward(q, k, v, key_mask, out, lse, d_out, lam: float):
    """``(dq, dk, dv)`` ``(B, H, n, d)`` in the inputs' dtype; ``out, lse`` from :func:`l1_forward`."""
    B, H, n, d = q.shape
    delta = (d_out.float() * out.float()).sum(-1)  # Δ (B, H, n)
    mask = key_mask.to(torch.uint8)
    dq, dk, dv = (torch.empty(B, H, n, d, device=q.device, dtype=q.dtype) for _ in range(3))
    rest = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *d_out.stride()[:3], mask.stride(0), H, n, d,
              -lam * LOG2E / math.sqrt(d), -lam / math.sqrt(d))
    cfg = config("_l1_bwd_kv", n, d, q)
    parts = cfg.constexprs["BLOCK_D"] // cfg.constexprs["BLOCK_DO"]
    launch("_l1_bwd_kv", (B * H, triton.cdiv(n, cfg.constexprs["BLOCK_N"]) * parts), cfg,
           q, k, v, mask, d_out, lse, delta, dk, dv, *rest, loop=("queries", triton.cdiv(n, cfg.constexprs["BLOCK_M"])))
    cfg = config("_l1_bwd_q", n, d, q)
    launch("_l1_bwd_q", (B * H, triton.cdiv(n, cfg.constexprs["BLOCK_M"])), cfg,
           q, k, v, mask, d_out, lse, delta, dq, *rest, loop=("keys", triton.cdiv(n, cfg.constexprs["BLOCK_N"])))
    return dq, dk, dv
