"""Launch parameters of the fused pseudo-inverse kernels (:mod:`kernels.pinv.forward`, :mod:`kernels.pinv.backward`).

A program runs one ``m × m`` problem in ``BLOCK × BLOCK`` float32 tiles, ``BLOCK = max(16, next_pow2(m))``
(:func:`block_size`; ``tl.dot`` needs every operand dimension ≥ 16), zero-padded. Each product's operands come from
global memory (the problem's own tiles, written just before: :func:`kernels.pinv.forward.product`), sixteen
columns at a time, so a thread holds an accumulator and two narrow slices rather than whole operands, and every
kernel compiles without spills on sm_80 and sm_90 at each size (what ``tests/kernels/test_pinv_triton.py`` checks;
registers and the spills of the kernels that held their tiles in registers: docs/bench.md, "plan --predict").
The accumulators are registers: a 128 × 128 float32 tile is 64 KiB, a quarter of an SM's register file, so the
kernels stop at :data:`MAX_M` = 64 and larger problems run the PyTorch form (:func:`attention.pinv.iterative_pinv`).
:data:`WARPS` gives the warps per kernel and block size: the most that compile without spills on both
architectures, up to 16 (latency hiding; the serial backward's products run in TF32 passes for its 16:
:func:`kernels.pinv.forward.product_in_passes`); no loop loads are pipelined (``num_stages = 1``).
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
WARPS = {"_pinv_fwd": {16: 4, 32: 4, 64: 16}, "_pinv_bwd_terms": {16: 4, 32: 8, 64: 8},
         "_pinv_bwd_steps": {16: 4, 32: 8, 64: 16}, "_pinv_bwd_grad": {16: 4, 32: 8, 64: 16}}
POINTER_TYPES = {
    "_pinv_fwd": {"A": "*fp32", "NORM": "*fp32", "Z": "*fp32", "ITERATES": "*fp32", "WORK": "*fp32"},
    "_pinv_bwd_terms": {"A": "*fp32", "ITERATES": "*fp32", "TERMS": "*fp32"},
    "_pinv_bwd_steps": {"ITERATES": "*fp32", "TERMS": "*fp32", "DZ": "*fp32", "WORK": "*fp32"},
    "_pinv_bwd_grad": {"A": "*fp32", "NORM": "*fp32", "ITERATES": "*fp32", "TERMS": "*fp32", "WORK": "*fp32",
                       "DA": "*fp32", "DNORM": "*fp32"},
}
KERNELS = tuple(POINTER_TYPES)
# tiles per problem of the forward's WORK, of the backward's TERMS per step and of its WORK (the kernels' modules)
FORWARD_TILES, TERMS_TILES, BACKWARD_TILES = (forward.WORK_TILES.value, backward.TERMS_PER_STEP.value,
                                              backward.WORK_TILES.value)


def takes(m: int) -> bool:
    """Whether the kernels serve ``m × m`` problems: ``1 ≤ m ≤ 64`` (zero-padded to ``BLOCK``)."""
    return 1 <= m <= MAX_M


def block_size(m: int) -> int:
    """The tile side for ``m × m`` problems: ``max(16, next_pow2(m))`` (``tl.dot`` needs every dimension ≥ 16)."""
    return max(MIN_DOT, triton.next_power_of_2(m))


def tiles(problems: int, m: int, *count: int) -> tuple[int, ...]:
    """The shape of ``count`` zero-padded ``BLOCK × BLOCK`` tiles per problem: ``(P, *count, BLOCK, BLOCK)``."""
    block = block_size(m)
    return problems, *count, block, block


def launch_config(kernel: str, m: int, has_norm: bool, save: bool = False) -> LaunchConfig:
    """Constexprs, warps and stages of ``kernel`` on ``m × m`` problems (the same on every architecture)."""
    if not takes(m):
        raise ValueError(f"the fused pseudo-inverse takes 1 <= m <= {MAX_M}, got m = {m}")
    constexprs = {"BLOCK": block_size(m)}
    if kernel in ("_pinv_fwd", "_pinv_bwd_grad"):
        constexprs["HAS_NORM"] = has_norm
    if kernel == "_pinv_fwd":
        constexprs["SAVE"] = save
    return LaunchConfig(constexprs, num_warps=WARPS[kernel][constexprs["BLOCK"]], num_stages=1)


def kernel_function(kernel: str):
    """The ``@triton.jit`` function named ``kernel``."""
    return getattr(forward, kernel, None) or getattr(backward, kernel)


def launch(kernel: str, problems: int, config: LaunchConfig, *args, n_iter: int) -> None:
    """One program per problem running the ``n_iter`` steps serially, or for ``_pinv_bwd_terms`` one per problem and
    step; under the interpreter the tensors' types are checked against :data:`POINTER_TYPES`."""
    if kernel == "_pinv_bwd_terms":
        grid, loop = (problems, n_iter), ("none", 1)
    else:
        grid, loop = (problems,), ("iterations", n_iter)
    common.launch(kernel_function(kernel), grid, config, POINTER_TYPES[kernel], *args, loop=loop)


def compile_kernel(kernel: str, capability: int, m: int, has_norm: bool = False, save: bool = True) -> aot.Compiled:
    """AOT-compile ``kernel`` for ``sm_<capability>`` with the launch parameters for ``m``."""
    config = launch_config(kernel, m, has_norm, save)
    return aot.compile_jit(kernel_function(kernel), capability, config, POINTER_TYPES[kernel], (), name=kernel)


def check_float32(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        if tensor.dtype != torch.float32:
            raise TypeError(f"the fused pseudo-inverse runs in float32, got a {tensor.dtype} tensor")
