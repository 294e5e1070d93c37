"""Launch parameters of the fused pseudo-inverse kernels (:mod:`kernels.pinv.forward`, :mod:`kernels.pinv.backward`).

A program holds its whole ``m × m`` problem as ``BLOCK × BLOCK`` float32 register tiles, ``BLOCK =
max(16, next_pow2(m))`` (``tl.dot`` needs every operand dimension ≥ 16). Registers, not shared memory, bound
the size: the forward keeps four such tiles live (``A, Z, AZ``, ``inner`` or ``S``), the backward seven
(also ``G``, ``∂A``, ``∂S`` or ``∂inner``, ``∂(AZ)``). The forward's products are 3xTF32 tensor-core dots
(:data:`kernels.pinv.forward.PRECISION`); the backward's are IEEE float32 dots on the FMA units, where Triton holds
each thread's rows of the left operand and columns of the right one over the whole K dimension in registers
(:func:`kernels.pinv.forward.mm` splits K into dots of 16 to bound that). A 128 × 128 tile is 64 KiB, a quarter of
an SM's 256 KiB register file, so the kernels stop at :data:`MAX_M` = 64 and larger problems run the PyTorch form
(:func:`attention.pinv.iterative_pinv`). At m = 64 (8 warps) the forward spills nothing on sm_90 and 256 B per
thread on sm_80 (in IEEE dots it spilled 392 B / 376 B), the backward 1,264 B on sm_90 (1,584 B on sm_80); the
backward in tensor-core dots spills more (3xTF32: 2.4–3.1 KB on sm_90 at 4–16 warps; TF32: 0.9–2.0 KB), so it keeps
IEEE dots until it is split into kernels of fewer live tiles (docs/bench.md, "plan --predict"). m ≤ 32 spills
nothing (:data:`SPILL_FREE`, what ``tests/kernels/test_pinv_triton.py`` compiles for sm_80 / sm_90). Each
``tl.dot`` stages its operands through shared memory (the forward at m = 64: 64 KiB on sm_80, 96 KiB on sm_90; the
backward 48 KiB). :data:`WARPS` gives the warps per kernel and block size, measured as the fewest spills; no loop
loads are pipelined (``num_stages = 1``).
"""

from __future__ import annotations

import torch
import triton

from kernels.common import aot
from kernels.common import launch as common
from kernels.common.launch import MIN_DOT, LaunchConfig
from kernels.pinv import backward, forward

MAX_M = 64
CHECKED_CAPABILITIES = (80, 90)
WARPS = {"_pinv_fwd": {16: 4, 32: 2, 64: 8}, "_pinv_bwd": {16: 4, 32: 8, 64: 8}}
SPILL_FREE = {"_pinv_fwd": (16, 32), "_pinv_bwd": (16, 32)}  # block sizes compiled without spills (sm_80, sm_90)
POINTER_TYPES = {
    "_pinv_fwd": {"A": "*fp32", "NORM": "*fp32", "Z": "*fp32", "SAVED": "*fp32"},
    "_pinv_bwd": {"A": "*fp32", "NORM": "*fp32", "SAVED": "*fp32", "DZ": "*fp32", "DA": "*fp32", "DNORM": "*fp32"},
}
KERNELS = tuple(POINTER_TYPES)


def takes(m: int) -> bool:
    """Whether the kernels serve ``m × m`` problems: ``1 ≤ m ≤ 64`` (zero-padded to ``BLOCK``)."""
    return 1 <= m <= MAX_M


def launch_config(kernel: str, m: int, has_norm: bool, save: bool = False) -> LaunchConfig:
    """Constexprs, warps and stages of ``kernel`` on ``m × m`` problems (the same on every architecture)."""
    if not takes(m):
        raise ValueError(f"the fused pseudo-inverse takes 1 <= m <= {MAX_M}, got m = {m}")
    block = max(MIN_DOT, triton.next_power_of_2(m))
    constexprs = {"BLOCK": block, "HAS_NORM": has_norm}
    if kernel == "_pinv_fwd":
        constexprs["SAVE"] = save
    return LaunchConfig(constexprs, num_warps=WARPS[kernel][block], num_stages=1)


def kernel_function(kernel: str):
    """The ``@triton.jit`` function named ``kernel``."""
    return getattr(forward, kernel, None) or getattr(backward, kernel)


def launch(kernel: str, problems: int, config: LaunchConfig, *args, n_iter: int) -> None:
    """One program per problem, each running the ``n_iter`` iterations serially; under the interpreter the tensors'
    types are checked against :data:`POINTER_TYPES`."""
    common.launch(kernel_function(kernel), (problems,), config, POINTER_TYPES[kernel], *args, loop=("iterations", n_iter))


def compile_kernel(kernel: str, capability: int, m: int, has_norm: bool = False, save: bool = True) -> aot.Compiled:
    """AOT-compile ``kernel`` for ``sm_<capability>`` with the launch parameters for ``m``."""
    config = launch_config(kernel, m, has_norm, save)
    return aot.compile_jit(kernel_function(kernel), capability, config, POINTER_TYPES[kernel], (), name=kernel)


def check_float32(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        if tensor.dtype != torch.float32:
            raise TypeError(f"the fused pseudo-inverse runs in float32, got a {tensor.dtype} tensor")
