"""Launch parameters of the FlashCUR kernels: the one function the wrappers and the AOT test share.

:func:`launch_config` gives, for a kernel, a shape ``(n, m, d)``, an input dtype and a GPU
architecture, every compile-time parameter of the launch — block sizes, ``F32_DOT``/``PRECISION``,
``M`` where it is a constexpr, ``num_warps``, ``num_stages``. The wrappers in
:mod:`kernels.flashcur` / :mod:`kernels.flashcur_bwd` launch with it (:func:`launch`), and
``tests/test_aot_compile.py`` compiles with it for sm_80 and sm_90 (:mod:`kernels.aot`), so what the
test checks is what runs.

Pointer argument types (:data:`POINTER_TYPES`) are part of the contract too: under the interpreter
:func:`launch` checks that the tensors passed have them, so the AOT signature cannot drift from the
real launch.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
import triton

SUPPORTED_M = (16, 32, 64, 128)
MIN_DOT = 16  # smallest tl.dot operand dimension a GPU accepts

# Largest dynamic shared memory one block may use (the opt-in maximum), bytes, per compute capability.
# sm_80 and sm_90 are compiled and checked by tests/test_aot_compile.py; the others use the same rule.
SHARED_MEMORY_LIMIT = {
    70: 98_304, 75: 65_536, 80: 167_936, 86: 101_376, 87: 167_936, 89: 101_376, 90: 232_448, 100: 232_448, 120: 101_376,
}
CHECKED_CAPABILITIES = (80, 90)
MARGIN = 2_048  # bytes kept free below the limit for what the estimate does not count (barriers, reductions)

IN = "in"  # pointer to tensors of the input dtype (q, k, v, and the output / its gradient)
POINTER_TYPES = {
    "_rv_fwd": {"QI": IN, "K": IN, "V": IN, "MASK": "*u8", "RV": "*fp32", "LSE": "*fp32"},
    "_u_fwd": {"QI": IN, "KJ": IN, "VALIDK": "*u8", "U": "*fp32"},
    "_out_fwd": {"Q": IN, "KJ": IN, "VALIDK": "*u8", "W": "*fp32", "RV": "*fp32", "SLOT": "*i32", "OUT": IN, "LSE": "*fp32"},
    "_rv_bwd_kv": {
        "QI": IN, "K": IN, "V": IN, "MASK": "*u8", "DRV": "*fp32", "LSE": "*fp32", "DELTA": "*fp32", "DK": "*fp32", "DV": "*fp32",
    },
    "_rv_bwd_q": {"QI": IN, "K": IN, "V": IN, "MASK": "*u8", "DRV": "*fp32", "LSE": "*fp32", "DELTA": "*fp32", "DQI": "*fp32"},
    "_out_bwd_q": {
        "Q": IN, "KJ": IN, "VALIDK": "*u8", "W": "*fp32", "SLOT": "*i32", "DY": IN, "LSE": "*fp32", "DQ": "*fp32", "DELTA": "*fp32",
    },
    "_out_bwd_kw": {
        "Q": IN, "KJ": IN, "VALIDK": "*u8", "W": "*fp32", "SLOT": "*i32", "DY": IN, "LSE": "*fp32", "DELTA": "*fp32",
        "DKJ": "*fp32", "DW": "*fp32",
    },
}
KERNELS = tuple(POINTER_TYPES)
TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.uint8: "u8", torch.int32: "i32"}


@dataclass(frozen=True)
class LaunchConfig:
    """Compile-time parameters of one launch: constexpr values and the two Triton options."""

    constexprs: dict = field(hash=False)
    num_warps: int
    num_stages: int

    @property
    def options(self) -> dict:
        return {**self.constexprs, "num_warps": self.num_warps, "num_stages": self.num_stages}


def kernel_function(kernel: str):
    """The ``@triton.jit`` function named ``kernel`` (imported late: the kernel modules import this one)."""
    from kernels import flashcur, flashcur_bwd

    return getattr(flashcur, kernel, None) or getattr(flashcur_bwd, kernel)


def pointer_types(kernel: str, dtype: torch.dtype) -> dict[str, str]:
    """Triton pointer types (``*fp32`` …) of ``kernel``'s tensor arguments for inputs of ``dtype``."""
    element = "*" + TRITON_TYPES[dtype]
    return {name: element if kind == IN else kind for name, kind in POINTER_TYPES[kernel].items()}


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


# Per kernel: which tiles are dot operands (staged through shared memory), as (rows, cols, float32?).
# "fixed" tiles are loaded once per program; "loop" tiles once per iteration over tokens (pipelined:
# num_stages - 1 copies in flight); "scratch" is the probability tile a looped kernel feeds to a second dot.
# Measured (tests/test_aot_compile.py): the estimate matches Triton 3.9's allocation for these kernels
# within a few hundred bytes at fp32, m = 128, d = 128.
TILES = {
    "_rv_fwd": {"fixed": [("BLOCK_M", "BLOCK_D", False)], "loop": [("BLOCK_N", "BLOCK_D", False)] * 2,
                "scratch": [("BLOCK_M", "BLOCK_N", False)]},
    "_u_fwd": {"fixed": [("BLOCK_M", "BLOCK_D", False), ("M", "BLOCK_D", False)]},
    "_out_fwd": {"fixed": [("BLOCK_N", "BLOCK_D", False), ("M", "BLOCK_D", False), ("M", "BLOCK_D", True)]},
    "_rv_bwd_kv": {"fixed": [("BLOCK_N", "BLOCK_D", False)] * 2 + [("M", "BLOCK_D", False), ("M", "BLOCK_D", True)]},
    "_rv_bwd_q": {"fixed": [("BLOCK_M", "BLOCK_D", False), ("BLOCK_M", "BLOCK_D", True)],
                  "loop": [("BLOCK_N", "BLOCK_D", False)] * 2, "scratch": [("BLOCK_M", "BLOCK_N", True)]},
    "_out_bwd_q": {"fixed": [("BLOCK_N", "BLOCK_D", False)] * 2 + [("M", "BLOCK_D", False), ("M", "BLOCK_D", True)]},
    "_out_bwd_kw": {"fixed": [("BLOCK_M", "BLOCK_D", False), ("BLOCK_M", "BLOCK_D", True)],
                    "loop": [("BLOCK_N", "BLOCK_D", False)] * 2, "scratch": [("BLOCK_M", "BLOCK_N", True)]},
}


def shared_memory_estimate(kernel: str, sizes: dict[str, int], num_stages: int, operand_bytes: int) -> int:
    """Bytes of shared memory ``kernel`` stages its dot operands through (see :data:`TILES`).

    ``operand_bytes`` is 4 when the dots run in float32 (``F32_DOT``), else 2; float32 tensors
    (``W``, ``RV`` and gradients) are always 4.
    """
    tiles = TILES[kernel]

    def total(group: str) -> int:
        return sum(sizes[r] * sizes[c] * (4 if f32 else operand_bytes) for r, c, f32 in tiles.get(group, []))

    return total("fixed") + max(num_stages - 1, 1) * total("loop") + total("scratch")


def _candidates(kernel: str, sizes: dict[str, int]):
    """(BLOCK_N, num_stages, BLOCK_M), fastest first: BLOCK_N from the largest down to 16; for each,
    3 then 2 pipeline stages (kernels that loop over tokens); for each, BLOCK_M down to 16 (kernels
    that tile the m slots)."""
    tiles_m = "BLOCK_M" in kernel_function(kernel).arg_names
    block_n = sizes["BLOCK_N"]
    while block_n >= MIN_DOT:
        for stages in ((3, 2) if "loop" in TILES[kernel] else (3,)):
            block_m = sizes["BLOCK_M"]
            while block_m >= MIN_DOT:
                yield block_n, stages, block_m
                block_m = block_m // 2 if tiles_m else 0
        block_n //= 2


def shared_memory_limit(capability: int) -> int:
    """Opt-in shared memory per block of ``sm_<capability>``; an unknown one gets the smallest recent (sm_86's)."""
    return SHARED_MEMORY_LIMIT.get(capability, SHARED_MEMORY_LIMIT[86])


def launch_config(kernel: str, n: int, m: int, d: int, dtype: torch.dtype, capability: int, tf32: bool = False) -> LaunchConfig:
    """Every compile-time parameter of launching ``kernel`` on ``n`` tokens, ``m`` slots, head_dim ``d``.

    Rule: 4 warps; the first of :func:`_candidates` (``BLOCK_N``, stages, ``BLOCK_M``, from
    :func:`block_sizes` and 3 stages downwards) whose shared-memory estimate
    (:func:`shared_memory_estimate`) is within ``sm_<capability>``'s limit less :data:`MARGIN`.
    Raises ``ValueError`` naming ``attention.num_landmarks`` and the head dim when nothing fits.
    """
    from kernels.flashcur import interpreted

    fn = kernel_function(kernel)
    sizes = block_sizes(n, m, d)
    f32_dot = dtype == torch.float32 or interpreted()
    limit = shared_memory_limit(capability) - MARGIN
    for block_n, stages, block_m in _candidates(kernel, sizes):
        tried = {**sizes, "BLOCK_N": block_n, "BLOCK_M": block_m, "M": m}
        if shared_memory_estimate(kernel, tried, stages, 4 if f32_dot else 2) <= limit:
            break
    else:
        raise ValueError(
            f"FlashCUR cannot run m = {m} selected rows (attention.num_landmarks) with head_dim {d} in "
            f"{TRITON_TYPES[dtype]} on sm_{capability}: kernel {kernel} needs more than the "
            f"{shared_memory_limit(capability):,} bytes of shared memory a block may use even with 16-row tiles. "
            "Lower attention.num_landmarks, use a smaller head dim (model.d_model / model.num_heads), train in "
            "bf16 (trainer.precision=bf16-mixed), or use attention=curformer"
        )
    values = {
        **tried,
        "F32_DOT": f32_dot,
        "PRECISION": "tf32" if tf32 and not interpreted() else "ieee",
    }
    constexprs = {name: value for name, value in values.items() if name in fn.arg_names and _is_constexpr(fn, name)}
    return LaunchConfig(constexprs, num_warps=4, num_stages=stages)


def check_shape(m: int, d: int, capability: int) -> None:
    """Raise at config time when no dtype can serve ``(m, d)`` on ``sm_<capability>`` (bf16 needs the least)."""
    for kernel in KERNELS:
        launch_config(kernel, 1 << 16, m, d, torch.bfloat16, capability)


def _is_constexpr(fn, name: str) -> bool:
    """Whether ``name`` is annotated ``tl.constexpr`` (jitted and interpreted functions alike wrap ``fn.fn``)."""
    return "constexpr" in str(inspect.signature(fn.fn).parameters[name].annotation)


def device_capability(device: torch.device) -> int:
    """``major * 10 + minor`` of a CUDA device; 80 for CPU tensors (the interpreter ignores it)."""
    if device.type != "cuda":
        return 80
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def launch(kernel: str, grid, config: LaunchConfig, *args) -> None:
    """``kernel[grid](*args, **config)``; under the interpreter, first check the pointer types against
    :data:`POINTER_TYPES` (the AOT test compiles with those)."""
    from kernels.flashcur import interpreted

    fn = kernel_function(kernel)
    if interpreted():
        dtypes = {name: arg.dtype for name, arg in zip(fn.arg_names, args) if isinstance(arg, torch.Tensor)}
        found = {name: "*" + TRITON_TYPES[dtype] for name, dtype in dtypes.items()}
        expected = pointer_types(kernel, dtypes[next(iter(POINTER_TYPES[kernel]))])
        assert found == expected, f"{kernel}: pointer types {found} differ from kernels.launch.POINTER_TYPES {expected}"
    fn[grid](*args, **config.options)
