"""What both kernel families (:mod:`kernels.cur`, :mod:`kernels.l1`) launch with.

Each family's ``launch`` module turns a kernel, a shape, a dtype and a GPU architecture into a
:class:`LaunchConfig` (its own tile tables and rules) with the pieces here:

* per architecture, the shared memory one block may use (:data:`SHARED_MEMORY_LIMIT`,
  :func:`shared_memory_limit`) and :func:`shared_memory_estimate`, the bytes a kernel's staged tiles
  take, which a launch keeps under the limit less :data:`MARGIN`;
* the interpreter switch: :func:`interpreted` (kernels defined for Triton's CPU interpreter) and
  :func:`dot_constexprs`, the ``F32_DOT`` / ``PRECISION`` constexprs of :func:`mm`, the ``tl.dot``
  every kernel of both families multiplies with;
* pointer types: each family declares its kernels' tensor arguments (:data:`IN`: the input dtype);
  :func:`pointer_types` resolves them for a dtype, :func:`launch` checks the tensors passed against
  them under the interpreter, and :mod:`kernels.common.aot` compiles with them, so the signature the
  AOT tests compile is the launched one;
* the launch plan: inside :func:`recording`, a launch on ``meta`` tensors is recorded (:class:`PlannedLaunch`: grid,
  serial loop, tensor arguments) instead of run, with :func:`device_capability` answering the recorded
  architecture, so ``python -m lra.bench plan`` lists the Triton launches of a GPU step on a machine without one,
  computed by the same launch code.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

# Largest dynamic shared memory one block may use (the opt-in maximum), bytes, per compute capability.
# sm_80 and sm_90 are compiled and checked by the AOT tests; the others use the same rule.
SHARED_MEMORY_LIMIT = {
    70: 98_304, 75: 65_536, 80: 167_936, 86: 101_376, 87: 167_936, 89: 101_376, 90: 232_448, 100: 232_448, 120: 101_376,
}
MARGIN = 2_048  # bytes kept free below the limit for what the estimates do not count (barriers, reductions)
MIN_DOT = 16  # smallest tl.dot operand dimension a GPU accepts
SMS = 132  # streaming multiprocessors of an H100 / H200
TWO_WAVES = 2 * SMS  # programs a kernel whose work grows with the sequence launches at least: it fills the GPU twice

IN = "in"  # pointer to tensors of the input dtype (q, k, v, and the output / its gradient)
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


@triton.jit
def mm(a, b, F32_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """``a @ b`` with a float32 accumulator; operands in float32 when ``F32_DOT`` else in ``b``'s dtype."""
    if F32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)
    return tl.dot(a.to(b.dtype), b)


def interpreted() -> bool:
    """True when Triton defines kernels for its CPU interpreter: ``TRITON_INTERPRET=1`` was set when this
    module was imported (every kernel module imports it before defining its kernels)."""
    return not isinstance(mm, triton.runtime.jit.JITFunction)


def runs_interpreted(device: torch.device) -> bool:
    """Whether a launch on ``device`` runs in the interpreter: CPU tensors under ``TRITON_INTERPRET=1``. A ``meta``
    launch (``python -m lra.bench plan``) is planned as a GPU runs it, interpreter or not."""
    return interpreted() and device.type == "cpu"


def dot_constexprs(dtype: torch.dtype, tf32: bool, interpreter: bool = False) -> dict:
    """``F32_DOT`` and ``PRECISION`` of :func:`mm` for inputs of ``dtype``: float32 operands for float32
    inputs and in the interpreter (``interpreter``: it computes bf16 dots wrongly); TF32 only when asked, never
    interpreted."""
    return {"F32_DOT": dtype == torch.float32 or interpreter, "PRECISION": "tf32" if tf32 and not interpreter else "ieee"}


def pointer_types(kinds: dict[str, str], dtype: torch.dtype) -> dict[str, str]:
    """Triton pointer types (``*fp32`` …) of a kernel's tensor arguments declared as ``kinds``
    (name -> :data:`IN` or a pointer type) for inputs of ``dtype``."""
    element = "*" + TRITON_TYPES[dtype]
    return {name: element if kind == IN else kind for name, kind in kinds.items()}


def shared_memory_limit(capability: int) -> int:
    """Opt-in shared memory per block of ``sm_<capability>``; an unknown one gets the smallest recent (sm_86's)."""
    return SHARED_MEMORY_LIMIT.get(capability, SHARED_MEMORY_LIMIT[86])


def shared_memory_estimate(tiles: dict, sizes: dict, loop_copies: int, operand_bytes: int, tf32: bool = False) -> int:
    """Bytes of shared memory a kernel stages its dot operands through.

    ``tiles`` by group: "fixed" (loaded once per program), "loop" (once per iteration of the kernel's
    loop, ``loop_copies`` in flight when pipelined), "scratch" (computed in registers, staged for a dot
    or a layout conversion). A tile is ``(rows, cols)`` or ``(rows, cols, float32, twice)``: rows and
    cols a name in ``sizes`` or a number; float32 tiles take 4 bytes an element, the others
    ``operand_bytes``; ``twice``: also a transposed copy when the dots run in TF32 (``tf32``).
    """

    def tile_bytes(rows, cols, float32=False, twice=False) -> int:
        copies = 2 if twice and tf32 else 1
        return sizes.get(rows, rows) * sizes.get(cols, cols) * (4 if float32 else operand_bytes) * copies

    def total(group: str) -> int:
        return sum(tile_bytes(*tile) for tile in tiles.get(group, []))

    return total("fixed") + loop_copies * total("loop") + total("scratch")


@dataclass(frozen=True)
class PlannedLaunch:
    """One kernel launch as :func:`recording` saw it: ``kernel`` name, ``grid``, the serial ``loop`` each program
    runs (what it walks, and how many iterations), and ``tensors``: ``(shape, dtype)`` of each tensor argument;
    ``fn``, ``config``, ``pointers`` (Triton pointer types of its tensor arguments) and ``floats`` (its float scalar
    arguments): what :func:`kernels.common.aot.compile_jit` needs to compile the launch (its registers and shared
    memory, for ``lra.bench plan --predict``)."""

    kernel: str
    grid: tuple[int, ...]
    loop: tuple[str, int]
    tensors: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    fn: object = field(default=None, compare=False, repr=False)
    config: LaunchConfig | None = field(default=None, compare=False, repr=False)
    pointers: dict = field(default_factory=dict, compare=False, repr=False)
    floats: tuple[str, ...] = ()

    @property
    def programs(self) -> int:
        return math.prod(self.grid)


_RECORDER: dict = {}  # while recording: {"launches": [...], "capability": int}


@contextlib.contextmanager
def recording(capability: int = 90):
    """Record (not run) every :func:`launch` on ``meta`` tensors inside the block, as on ``sm_<capability>``; yields
    the list of :class:`PlannedLaunch` it fills."""
    if _RECORDER:
        raise RuntimeError("kernels.common.launch.recording is already active")
    _RECORDER.update(launches=[], capability=capability)
    try:
        yield _RECORDER["launches"]
    finally:
        _RECORDER.clear()


def planning(x: torch.Tensor) -> bool:
    """Whether ``x`` is a ``meta`` tensor inside :func:`recording` (its launches are recorded, not run)."""
    return bool(_RECORDER) and x.device.type == "meta"


def device_capability(device: torch.device) -> int:
    """``major * 10 + minor`` of a CUDA device; under :func:`recording`, the recorded one for ``meta`` tensors; 80 for
    CPU tensors (the interpreter ignores it)."""
    if _RECORDER and device.type == "meta":
        return _RECORDER["capability"]
    if device.type != "cuda":
        return 80
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def launch(fn, grid, config: LaunchConfig, kinds: dict[str, str], *args, loop: tuple[str, int]) -> None:
    """``fn[grid](*args, **config.options)``; under the interpreter, first check the tensors' types
    against the declared ``kinds`` (:func:`pointer_types` of the first argument's dtype). ``loop``: what each
    program walks serially and how many iterations (``("keys", cdiv(n, BLOCK_N))``; ``("none", 1)``), which
    :func:`recording` keeps for the launch plan."""
    if _RECORDER and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
        tensors = tuple((tuple(a.shape), a.dtype) for a in args if isinstance(a, torch.Tensor))
        name = getattr(getattr(fn, "fn", fn), "__name__", str(fn))
        names = getattr(fn, "arg_names", ())
        floats = tuple(arg for arg, value in zip(names, args) if isinstance(value, float))
        _RECORDER["launches"].append(PlannedLaunch(name, tuple(int(g) for g in grid), (loop[0], int(loop[1])), tensors,
                                                   fn, config, pointer_types(kinds, args[0].dtype), floats))
        return
    if interpreted():
        found = {name: "*" + TRITON_TYPES[a.dtype] for name, a in zip(fn.arg_names, args) if isinstance(a, torch.Tensor)}
        expected = pointer_types(kinds, args[0].dtype)
        assert found == expected, f"{fn.fn.__name__}: pointer types {found} differ from the declared {expected}"
    fn[grid](*args, **config.options)
