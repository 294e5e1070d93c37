"""Dropout by a hash of (seed, index) on the CPU: the binding of ``cpu.cpp`` and the custom op ``lra::dropout``
over it (the module: :class:`models.dropout.Dropout`; the plain PyTorch reference: :mod:`kernels.dropout.naive`).

``y_i = x_i · keep_i / (1 − p)`` with ``keep_i = [hash(seed, i) ≥ p · 2³²]`` in one pass over a contiguous CPU tensor
(float32, float64, bfloat16). ``hash`` is the splitmix64 output function (Steele, Lea & Flood, OOPSLA 2014; Vigna's
constants): ``h_i = mix(mix(seed) + i · 0x9E3779B97F4A7C15)``, its upper 32 bits against ``round(p · 2³²)``, so the
mask depends on ``(seed, i)`` only, not on the threads or the chunking.

:func:`dropout` is the custom op ``lra::dropout`` (``torch.library.custom_op`` with a fake and an autograd formula:
backward is the same kernel on the gradient with the same seed, so only the seed is saved), so ``torch.compile``
keeps one graph and calls the same kernel. Backend, chosen once by :func:`takes`: CPU tensors of a dtype in
:data:`KERNELS`, ``0 < p < 1`` and the library built; anything else is ``F.dropout``. Without a compiler
:func:`library` warns once and is None (:mod:`kernels.common.build`).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from kernels.common.build import load_or_warn, source

KERNELS = {torch.float32: "dropout_f32", torch.float64: "dropout_f64", torch.bfloat16: "dropout_bf16"}


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """``cpu.cpp`` built and loaded, or None (with a warning) without a compiler."""
    argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_double, ctypes.c_int]
    return load_or_warn(source("dropout/cpu.cpp"), "Dropout on CPU runs as F.dropout", None,
                        {name: argtypes for name in KERNELS.values()})


def run(x: torch.Tensor, seed: int, p: float) -> torch.Tensor:
    """The kernel: ``x · keep / (1 − p)`` (contiguous, ``x``'s shape and dtype) for a CPU tensor of a dtype in
    :data:`KERNELS`, ``0 < p < 1`` and a 64-bit ``seed``."""
    x = x.contiguous()
    y = torch.empty_like(x)
    getattr(library(), KERNELS[x.dtype])(x.data_ptr(), y.data_ptr(), x.numel(), seed % 2**64, p,
                                         torch.get_num_threads())
    return y


@torch.compiler.assume_constant_result
def kernel_available() -> bool:
    """Whether the CPU kernel is built (a constant to ``torch.compile``: building it is no part of a graph)."""
    return library() is not None


def takes(x: torch.Tensor, p: float) -> bool:
    """Whether dropout with rate ``p`` of ``x`` runs :func:`dropout` (the kernel), else ``F.dropout``: CPU tensors of
    a dtype in :data:`KERNELS`, ``p < 1`` (``p = 0`` is the caller's identity) and the library built."""
    return p != 1 and x.device.type == "cpu" and x.dtype in KERNELS and kernel_available()


@torch.library.custom_op("lra::dropout", mutates_args=())
def dropout(x: torch.Tensor, seed: torch.Tensor, p: float) -> torch.Tensor:
    """``x · keep / (1 − p)`` with ``keep_i = hash(seed, i) ≥ p · 2³²`` (CPU, ``0 < p < 1``; ``seed`` an int64
    scalar tensor): the result is contiguous, with ``x``'s shape and dtype."""
    return run(x, int(seed), p)


@dropout.register_fake
def _(x: torch.Tensor, seed: torch.Tensor, p: float) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _setup_context(ctx, inputs, output) -> None:
    _, seed, p = inputs
    ctx.save_for_backward(seed)
    ctx.p = p


def _backward(ctx, grad: torch.Tensor):
    (seed,) = ctx.saved_tensors
    return dropout(grad, seed, ctx.p), None, None  # the same mask and scale: the op is linear in x


dropout.register_autograd(_backward, setup_context=_setup_context)
