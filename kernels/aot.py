"""Ahead-of-time compilation of the FlashCUR kernels for a CUDA target, on any machine (no GPU needed).

Triton compiles a ``@triton.jit`` function for a named target (``GPUTarget("cuda", 80, 32)``) with the
``ptxas`` shipped in its wheel, so the shared memory, registers and spills a kernel will need on an
A100 (sm_80) or H100 (sm_90) are known before any GPU is touched. :func:`compile_kernel` compiles one
kernel with exactly the launch parameters the wrappers use (:func:`kernels.launch.launch_config`) and
the argument types they pass (:data:`kernels.launch.POINTER_TYPES`) and returns a :class:`Compiled`:

    >>> c = compile_kernel("_rv_fwd", capability=80, dtype=torch.float32, n=4096, m=128, d=128)
         >>> c.shared, c.stack, c.fits           # bytes of shared memory, bytes spilled, within the sm_80 limit

Spills are read from the cubin (:func:`resource_usage`: ``cuobjdump -res-usage``, stack frame bytes;
the compiled kernel's ``n_spills`` is only filled in when the binary is loaded on a device). ``tests/test_aot_compile.py`` runs this over every kernel,
architecture, dtype and supported shape.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import launch

USAGE_RE = re.compile(r"REG:(?P<reg>\d+) STACK:(?P<stack>\d+)")
CUOBJDUMP = str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


@dataclass(frozen=True)
class Compiled:
    """What one AOT compile says about a kernel on a target."""

    kernel: str
    capability: int
    config: launch.LaunchConfig
    shared: int  # bytes of shared memory per program (block)
    registers: int  # per thread
    stack: int  # bytes of stack frame per thread: where spilled registers go (0 = no spills)

    @property
    def limit(self) -> int:
        return launch.SHARED_MEMORY_LIMIT[self.capability]

    @property
    def fits(self) -> bool:
        return self.shared <= self.limit and self.stack == 0


def signature(kernel: str, config: launch.LaunchConfig, dtype: torch.dtype) -> tuple[dict, dict, dict]:
    """``(signature, constexprs, attrs)`` for :class:`triton.compiler.ASTSource`, as a launch would build them.

    Pointers get their dtype from :data:`kernels.launch.POINTER_TYPES` and 16-byte alignment (torch
    allocations are), integers ``i32``, the two scales ``fp32``, constexprs the config's values.
    """
    fn = launch.kernel_function(kernel)
    pointers = launch.pointer_types(kernel, dtype)
    sig, attrs = {}, {}
    for index, name in enumerate(fn.arg_names):
        if name in config.constexprs:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = pointers[name]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif name in ("qk_scale", "sm_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig, dict(config.constexprs), attrs


def resource_usage(cubin: bytes) -> tuple[int, int]:
    """``(registers per thread, stack frame bytes)`` of the one kernel in ``cubin`` (``cuobjdump -res-usage``).

    Spilled registers live in the stack frame, and these kernels have no local arrays, so a stack
    frame of 0 bytes means no spills. (``CompiledKernel.n_spills`` is only filled in when the binary
    is loaded on a GPU; reading the cubin works anywhere, also when Triton's cache served it.)
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run([CUOBJDUMP, "-res-usage", str(path)], capture_output=True, text=True, check=True)
    match = USAGE_RE.search(proc.stdout)
    if match is None:
        raise RuntimeError(f"cuobjdump -res-usage printed no REG/STACK line:\n{proc.stdout}{proc.stderr}")
    return int(match["reg"]), int(match["stack"])


def compile_kernel(kernel: str, capability: int, dtype: torch.dtype, n: int, m: int, d: int, tf32: bool = False) -> Compiled:
    """AOT-compile ``kernel`` for ``sm_<capability>`` with the launch parameters for ``(n, m, d, dtype)``."""
    config = launch.launch_config(kernel, n, m, d, dtype, capability, tf32=tf32)
    sig, constexprs, attrs = signature(kernel, config, dtype)
    source = ASTSource(launch.kernel_function(kernel), sig, constexprs, attrs)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", capability, 32),
        options={"num_warps": config.num_warps, "num_stages": config.num_stages},
    )
    registers, stack = resource_usage(compiled.asm["cubin"])
    return Compiled(kernel, capability, config, compiled.metadata.shared, registers, stack)
