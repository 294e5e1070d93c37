"""Ahead-of-time compilation of Triton kernels for a CUDA target, on any machine (no GPU needed).

Triton compiles a ``@triton.jit`` function for a named target (``GPUTarget("cuda", 80, 32)``) with the
``ptxas`` shipped in its wheel, so the shared memory, registers and spills a kernel will need on an
A100 (sm_80) or H100 (sm_90) are known before any GPU is touched. :func:`compile_jit` compiles any
kernel from its launch parameters (a :class:`kernels.common.launch.LaunchConfig`: constexprs,
``num_warps``, ``num_stages``) and argument types (:func:`jit_signature`); the families compile with
exactly what their wrappers launch with, ``launch_config`` and ``pointer_types`` of
:mod:`kernels.cur.launch` (whose :func:`~kernels.cur.launch.compile_kernel` does it per
shape) and :mod:`kernels.l1.launch`. It returns a :class:`Compiled`:

    >>> c = compile_jit(fn, 80, config, pointers, floats)
    >>> c.shared, c.stack, c.fits           # bytes of shared memory, bytes spilled, within the sm_80 limit

Spills are read from the cubin (:func:`resource_usage`: ``cuobjdump -res-usage``, stack frame bytes;
the compiled kernel's ``n_spills`` is only filled in when the binary is loaded on a device).
``tests/kernels/test_aot_compile.py`` (FlashCUR) and ``tests/kernels/test_flashl1.py`` (FlashL1) run this over every
kernel, architecture, dtype and supported shape.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.interpreter import InterpretedFunction

from kernels.common.launch import SHARED_MEMORY_LIMIT, LaunchConfig

USAGE_RE = re.compile(r"REG:(?P<reg>\d+) STACK:(?P<stack>\d+)")
CUOBJDUMP = str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


@dataclass(frozen=True)
class Compiled:
    """What one AOT compile says about a kernel on a target."""

    kernel: str
    capability: int
    config: LaunchConfig
    shared: int  # bytes of shared memory per program (block)
    registers: int  # per thread
    stack: int  # bytes of stack frame per thread: where spilled registers go (0 = no spills)

    @property
    def limit(self) -> int:
        return SHARED_MEMORY_LIMIT[self.capability]

    @property
    def fits(self) -> bool:
        return self.shared <= self.limit and self.stack == 0


def jit_signature(fn, constexprs: dict, pointers: dict[str, str], floats: tuple[str, ...]) -> tuple[dict, dict, dict]:
    """``(signature, constexprs, attrs)`` of any ``@triton.jit`` function ``fn`` for :class:`ASTSource`.

    Arguments named in ``constexprs`` are constexprs with those values; those in ``pointers``
    (name -> ``"*fp32"`` …) pointers with 16-byte alignment (torch allocations are); those in ``floats``
    ``fp32``; every other one ``i32``.
    """
    sig, attrs = {}, {}
    for index, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = pointers[name]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif name in floats:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig, dict(constexprs), attrs


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


def compile_jit(fn, capability: int, config: LaunchConfig, pointers: dict[str, str], floats: tuple[str, ...],
                name: str | None = None) -> Compiled:
    """AOT-compile any ``@triton.jit`` ``fn`` for ``sm_<capability>`` with ``config``'s constexprs,
    ``num_warps`` and ``num_stages``; argument types as :func:`jit_signature` (``pointers``, ``floats``).

    Under ``TRITON_INTERPRET=1`` ``fn`` is an interpreted function, which Triton cannot compile: the same kernel is
    compiled in a Python started without the interpreter (:func:`_compile_in_child`)."""
    if isinstance(fn, InterpretedFunction):
        return _compile_in_child(fn, capability, config, pointers, floats, name)
    sig, constexprs, attrs = jit_signature(fn, config.constexprs, pointers, floats)
    compiled = triton.compile(
        ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", capability, 32),
        options={"num_warps": config.num_warps, "num_stages": config.num_stages},
    )
    registers, stack = resource_usage(compiled.asm["cubin"])
    return Compiled(name or fn.fn.__name__, capability, config, compiled.metadata.shared, registers, stack)



def _compile_in_child(fn, capability: int, config: LaunchConfig, pointers: dict[str, str], floats: tuple[str, ...],
                      name: str | None) -> Compiled:
    """:func:`compile_jit` of the kernel that the interpreted ``fn`` defines (found again by its module and name), in
    a Python process without ``TRITON_INTERPRET``; its result comes back as JSON."""
    import json
    import os
    import sys

    python_fn = fn.fn
    request = {"module": python_fn.__module__, "name": python_fn.__qualname__, "capability": capability,
               "constexprs": config.constexprs, "num_warps": config.num_warps, "num_stages": config.num_stages,
               "pointers": pointers, "floats": list(floats), "label": name}
    child = ("import json, sys, importlib\n"
             "from kernels.common import aot\n"
             "from kernels.common.launch import LaunchConfig\n"
             "r = json.loads(sys.argv[1])\n"
             "fn = getattr(importlib.import_module(r['module']), r['name'])\n"
             "c = aot.compile_jit(fn, r['capability'], LaunchConfig(r['constexprs'], r['num_warps'], r['num_stages']),"
             " r['pointers'], tuple(r['floats']), r['label'])\n"
             "print(json.dumps([c.kernel, c.shared, c.registers, c.stack]))\n")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", child, json.dumps(request)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"AOT compile of {request['module']}.{request['name']} in a Python without "
                           f"TRITON_INTERPRET failed:\n{proc.stderr[-2000:]}")
    kernel, shared, registers, stack = json.loads(proc.stdout.strip().splitlines()[-1])
    return Compiled(kernel, capability, config, shared, registers, stack)
