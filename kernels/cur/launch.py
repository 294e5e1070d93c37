"""Launch parameters of the FlashCUR kernels: tiles, warps and stages per architecture, dtype and shape.

:func:`launch_config` gives, for a kernel, a shape ``(n, m, d)``, an input dtype and a GPU
architecture, every compile-time parameter of the launch — block sizes, ``F32_DOT``/``PRECISION``,
``M`` where it is a constexpr, ``num_warps``, ``num_stages`` — memoised per shape; :func:`splits` the split of n
for the kernels whose programs walk all n tokens (:data:`SPLIT_KERNELS`: at least :data:`TARGET_PROGRAMS`
programs, two waves on an H100 / H200). :mod:`kernels.cur.run` launches with it (:func:`config`, :func:`launch`),
and ``tests/kernels/test_aot_compile.py`` compiles with it for sm_80 and sm_90 (:func:`compile_kernel`), so what
the test checks is what runs. Shared memory limits, the estimate and the interpreter switch are
:mod:`kernels.common.launch`'s.

Pointer argument types (:data:`POINTER_TYPES`) are part of the contract too: under the interpreter
:func:`launch` checks that the tensors passed have them, so the AOT signature cannot drift from the
real launch.

The functions that allocate and launch with these parameters: :mod:`kernels.cur.run`.
"""

from __future__ import annotations

import functools
import inspect

import torch
import triton

from kernels.common import aot
from kernels.common import launch as common
from kernels.common.launch import IN, MARGIN, MIN_DOT, TRITON_TYPES, LaunchConfig
from kernels.cur import backward, forward
from kernels.cur.tiles import (KIND, REGISTER_TILES, SHARED_RULE_WARPS, SHARED_RULE_WIDE, SHARED_RULE_WIDE_WARPS,
                                TILES, operands, register_launch)

SUPPORTED_M = (16, 32, 64, 128)
CHECKED_CAPABILITIES = (80, 90)  # where REGISTER_TILES was measured; tests/kernels/test_aot_compile.py compiles for both
FLOAT_ARGS = ("qk_scale", "sm_scale")  # the kernels' float scalars (every other scalar is an i32)

POINTER_TYPES = {
    "_rv_fwd": {"QI": IN, "K": IN, "V": IN, "MASK": "*u8", "RV": "*fp32", "LSE": "*fp32"},
    "_u_fwd": {"QI": IN, "KJ": IN, "VALIDK": "*u8", "U": "*fp32"},
    "_out_fwd": {"Q": IN, "KJ": IN, "VALIDK": "*u8", "W": "*fp32", "RV": "*fp32", "SLOT": "*i32", "OUT": IN, "LSE": "*fp32"},
    "_rv_bwd_kv": {
        "QI": IN, "K": IN, "V": IN, "MASK": "*u8", "DRV": "*fp32", "LSE": "*fp32", "DELTA": "*fp32", "DK": IN, "DV": IN,
    },
    "_rv_bwd_q": {"QI": IN, "K": IN, "V": IN, "MASK": "*u8", "DRV": "*fp32", "LSE": "*fp32", "DELTA": "*fp32", "DQI": "*fp32"},
    "_out_bwd_q": {
        "Q": IN, "KJ": IN, "VALIDK": "*u8", "W": "*fp32", "SLOT": "*i32", "DY": IN, "Y": IN, "LSE": "*fp32", "DQ": IN,
        "DELTA": "*fp32",
    },
    "_out_bwd_kw": {
        "Q": IN, "KJ": IN, "VALIDK": "*u8", "W": "*fp32", "SLOT": "*i32", "DY": IN, "LSE": "*fp32", "DELTA": "*fp32",
        "DKJ": "*fp32", "DW": "*fp32",
    },
}
KERNELS = tuple(POINTER_TYPES)
# Kernels whose programs each walk the n tokens (a block of m rows or keys against every token): their n
# is split into S parts, a grid axis (:func:`splits`), and their m-sized results are per-split partials.
SPLIT_KERNELS = ("_rv_fwd", "_rv_bwd_q", "_out_bwd_kw")
TARGET_PROGRAMS = common.TWO_WAVES  # programs a split launch aims for: two waves on an H100 / H200


def kernel_function(kernel: str):
    """The ``@triton.jit`` function named ``kernel`` (:mod:`kernels.cur.forward` or ``.backward``)."""
    return getattr(forward, kernel, None) or getattr(backward, kernel)


def pointer_types(kernel: str, dtype: torch.dtype) -> dict[str, str]:
    """Triton pointer types (``*fp32`` …) of ``kernel``'s tensor arguments for inputs of ``dtype``."""
    return common.pointer_types(POINTER_TYPES[kernel], dtype)


def check_head_dim(d: int) -> None:
    """The kernels hold one head in a tile of ``next_power_of_2(d)`` columns: 16 <= d <= 128."""
    if not 16 <= d <= 128:
        raise ValueError(
            f"FlashCUR supports head_dim 16..128, got {d}: set model.d_model / model.num_heads in that range "
            "or use attention=curformer"
        )


def check_m(m: int) -> None:
    if m not in SUPPORTED_M:
        raise ValueError(
            f"FlashCUR supports m (attention.num_landmarks) in {SUPPORTED_M}, got {m}; "
            "pick one of these or use attention=curformer"
        )


def padded_m(m: int) -> int | None:
    """The smallest of :data:`SUPPORTED_M` that holds ``m`` slots (the rest inert), None above the largest."""
    return next((size for size in SUPPORTED_M if m <= size), None)


ROWS_KERNELS = ("_rv_fwd", "_rv_bwd_kv", "_rv_bwd_q")  # kernel (a) and its backward: R V alone


@torch.compiler.assume_constant_result  # compiled code: decided once while tracing, not traced through the caches
def rows_fit(m: int, d: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether kernel (a) and its backward (:data:`ROWS_KERNELS`) take ``m`` rows (padded to :func:`padded_m`),
    head dim ``d`` and operands of ``dtype`` (float32, float16 or bfloat16) on ``device``: tiles within its shared
    memory (:func:`launch_config`, which raises where nothing fits). For the fused CUR and Nyström forms, which run
    their split-K rows stage where this is False (:func:`attention.landmark_stages.rows_attention`)."""
    size = padded_m(m)
    if size is None or not 16 <= d <= 128 or dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    capability, interpreter = common.device_capability(device), common.runs_interpreted(device)
    try:
        for kernel in ROWS_KERNELS:  # the largest tiles (n 2^16): any shorter n fits if this does
            launch_config(kernel, 1 << 16, size, d, dtype, capability, tf32=torch.backends.cuda.matmul.allow_tf32,
                          interpreter=interpreter)
    except ValueError:
        return False
    return True


def block_sizes(n: int, m: int, d: int) -> dict[str, int]:
    """The largest tile sizes for ``n`` tokens, ``m`` slots, head_dim ``d`` (powers of two, ≥ 16), before any
    architecture limit: ``BLOCK_N = min(64, next_pow2(n))``, ``BLOCK_M = min(m, 64)``, ``BLOCK_D = next_pow2(d)``.
    """
    check_m(m)
    check_head_dim(d)
    sizes = {
        "BLOCK_N": min(64, max(MIN_DOT, triton.next_power_of_2(n))),
        "BLOCK_M": min(m, 64),
        "BLOCK_D": max(MIN_DOT, triton.next_power_of_2(d)),
    }
    assert all(size >= MIN_DOT and size & (size - 1) == 0 for size in sizes.values()), sizes
    return sizes


def _candidates(kernel: str, sizes: dict[str, int], m: int, operand_class: str):
    """(BLOCK_N, BLOCK_M, num_warps, num_stages), fastest first.

    BLOCK_N from :func:`block_sizes`'s (capped by :data:`REGISTER_TILES`) down to 16 (_u_fwd has
    none); within it, under a register rule, :func:`register_launch`'s warps and stages with BLOCK_M
    from its largest down to 16; under :data:`SHARED_RULE` 4 warps (8 for _rv_fwd's 64 × 128 accumulators,
    :data:`SHARED_RULE_WIDE`), 3 then 2 pipeline stages (1 for
    _u_fwd, which has no loop), BLOCK_M from :func:`block_sizes`'s down, keeping BLOCK_N ≤ 2 · BLOCK_M
    (bf16 _rv_fwd at m = 16 with BLOCK_N = 64 spills 8 B on sm_90).
    """
    tiles = REGISTER_TILES[kernel][operand_class]
    kind = KIND[kernel]
    block_n = MIN_DOT if kind == "u" else min(sizes["BLOCK_N"], tiles[0] if tiles else sizes["BLOCK_N"])
    while block_n >= MIN_DOT:
        rule = register_launch(kernel, operand_class, m, sizes["BLOCK_D"], block_n)
        if rule is not None:
            largest_m, warps, stages_list = rule[0], rule[1], (rule[2],)
        else:
            largest_m, warps, stages_list = sizes["BLOCK_M"], SHARED_RULE_WARPS, (1,) if kind == "u" else (3, 2)
        for stages in stages_list:
            block_m = largest_m
            while block_m >= MIN_DOT:
                if rule is not None or kind == "u" or block_n <= 2 * block_m:
                    wide = rule is None and kind == "rows" and block_m * sizes["BLOCK_D"] >= SHARED_RULE_WIDE
                    yield block_n, block_m, SHARED_RULE_WIDE_WARPS if wide else warps, stages
                block_m //= 2
        block_n //= 2


def shared_memory_estimate(kernel: str, sizes: dict[str, int], num_stages: int, operand_bytes: int, tf32: bool = False) -> int:
    """Bytes of shared memory ``kernel`` stages its dot operands through (:data:`TILES`; pipelined loop
    tiles count ``num_stages - 1`` times). ``operand_bytes`` is 4 when the dots run in float32
    (``F32_DOT``), else 2; ``tf32``: the dots run on tensor cores in TF32 (transposed second copies)."""
    return common.shared_memory_estimate(TILES[kernel], sizes, max(num_stages - 1, 1), operand_bytes, tf32)


@functools.lru_cache(maxsize=None)
def launch_config(kernel: str, n: int, m: int, d: int, dtype: torch.dtype, capability: int, tf32: bool = False,
                  interpreter: bool = False) -> LaunchConfig:
    """Every compile-time parameter of launching ``kernel`` on ``n`` tokens, ``m`` slots, head_dim ``d``
    (memoised per shape: a launch does not re-derive it; the returned config is shared, never mutate it).

    Rule: the first of :func:`_candidates` (tiles from the largest down; warps and stages from the
    register rule, :func:`register_launch`, or for tensor-core-only launches 4 warps and 3 or 2
    stages) whose shared-memory estimate (:func:`shared_memory_estimate`) is within
    ``sm_<capability>``'s limit less :data:`MARGIN`. ``tests/kernels/test_aot_compile.py`` compiles the result
    for sm_80 and sm_90 and checks shared memory and spills. Raises ``ValueError`` naming
    ``attention.num_landmarks`` and the head dim when nothing fits. ``interpreter``: the launch runs in Triton's
    interpreter (float32 dots, :func:`kernels.common.launch.dot_constexprs`).
    """
    fn = kernel_function(kernel)
    sizes = block_sizes(n, m, d)
    dots = common.dot_constexprs(dtype, tf32, interpreter)
    limit = common.shared_memory_limit(capability) - MARGIN
    for block_n, block_m, warps, stages in _candidates(kernel, sizes, m, operands(dtype, tf32)):
        tried = {**sizes, "BLOCK_N": block_n, "BLOCK_M": block_m, "M": m}
        if shared_memory_estimate(kernel, tried, stages, 4 if dots["F32_DOT"] else 2, tf32=dots["PRECISION"] == "tf32") <= limit:
            break
    else:
        raise ValueError(
            f"FlashCUR cannot run m = {m} selected rows (attention.num_landmarks) with head_dim {d} in "
            f"{TRITON_TYPES[dtype]} on sm_{capability}: kernel {kernel} needs more than the "
            f"{common.shared_memory_limit(capability):,} bytes of shared memory a block may use even with 16-row tiles. "
            "Lower attention.num_landmarks, use a smaller head dim (model.d_model / model.num_heads), train in "
            "bf16 (trainer.precision=bf16-mixed), or use attention=curformer"
        )
    values = {**tried, **dots}
    constexprs = {name: value for name, value in values.items() if name in fn.arg_names and _is_constexpr(fn, name)}
    return LaunchConfig(constexprs, num_warps=warps, num_stages=stages)


@functools.lru_cache(maxsize=None)
def splits(programs: int, n: int, block_n: int, target: int = TARGET_PROGRAMS) -> tuple[int, int]:
    """``(S, SPLIT_N)``: the split of ``n`` tokens for a launch of :data:`SPLIT_KERNELS` whose other grid axes
    give ``programs`` programs (``B·H·m/BLOCK_M``), and the tokens per split (a multiple of ``block_n``).

    The fewest splits that reach ``target`` programs (``programs · S ≥ target``), each at least one
    ``block_n`` tile: ``per = max(1, tiles // ⌈target / programs⌉)`` tiles a split, ``S = ⌈tiles / per⌉``
    (no empty split); ``S = 1`` once ``programs ≥ target``. At B 8, H 2, n 4096, m 64 (64-token tiles,
    one 64-row block): 16 programs, 64 tiles, 3 tiles a split, S = 22, 352 programs.
    """
    tiles = triton.cdiv(max(n, 1), block_n)
    per = max(1, tiles // triton.cdiv(target, programs))
    return triton.cdiv(tiles, per), per * block_n


def check_shape(m: int, d: int, capability: int) -> None:
    """Raise at config time when no dtype can serve ``(m, d)`` on ``sm_<capability>`` (bf16 needs the least)."""
    for kernel in KERNELS:
        launch_config(kernel, 1 << 16, m, d, torch.bfloat16, capability)


def _is_constexpr(fn, name: str) -> bool:
    """Whether ``name`` is annotated ``tl.constexpr`` (jitted and interpreted functions alike wrap ``fn.fn``)."""
    return "constexpr" in str(inspect.signature(fn.fn).parameters[name].annotation)


def config(kernel: str, n: int, m: int, d: int, like: torch.Tensor) -> LaunchConfig:
    """:func:`launch_config` for inputs like ``like`` on its device (TF32 as torch allows)."""
    capability = common.device_capability(like.device)
    return launch_config(kernel, n, m, d, like.dtype, capability, tf32=torch.backends.cuda.matmul.allow_tf32,
                         interpreter=common.runs_interpreted(like.device))


def launch(kernel: str, grid, config: LaunchConfig, *args, loop: tuple[str, int]) -> None:
    """``kernel[grid](*args, **config.options)``; under the interpreter the tensors' types are checked
    against :data:`POINTER_TYPES` first (the AOT test compiles with those). ``loop``: what each program walks
    and how many iterations (:func:`kernels.common.launch.launch`; recorded by its ``recording``)."""
    common.launch(kernel_function(kernel), grid, config, POINTER_TYPES[kernel], *args, loop=loop)


def compile_kernel(kernel: str, capability: int, dtype: torch.dtype, n: int, m: int, d: int, tf32: bool = False) -> aot.Compiled:
    """AOT-compile ``kernel`` for ``sm_<capability>`` with the launch parameters for ``(n, m, d, dtype)``."""
    config = launch_config(kernel, n, m, d, dtype, capability, tf32=tf32)
    return aot.compile_jit(kernel_function(kernel), capability, config, pointer_types(kernel, dtype), FLOAT_ARGS, name=kernel)
