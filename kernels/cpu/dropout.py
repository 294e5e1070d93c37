"""Bindings of ``dropout.cpp``: ``y_i = x_i · keep_i / (1 − p)`` with ``keep_i = [hash(seed, i) ≥ p · 2³²]`` in one
pass over a contiguous CPU tensor (float32, float64, bfloat16); the module and its custom op:
:mod:`models.dropout`.

``hash`` is the splitmix64 output function (Steele, Lea & Flood, OOPSLA 2014; Vigna's constants):
``h_i = mix(mix(seed) + i · 0x9E3779B97F4A7C15)``, its upper 32 bits against ``round(p · 2³²)``, so the mask depends
on ``(seed, i)`` only, not on the threads or the chunking. Without a compiler :func:`library` warns once and is
None (:mod:`kernels.cpu.build`).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from kernels.cpu.build import load_or_warn, source

KERNELS = {torch.float32: "dropout_f32", torch.float64: "dropout_f64", torch.bfloat16: "dropout_bf16"}


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """``dropout.cpp`` built and loaded, or None (with a warning) without a compiler."""
    argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_double, ctypes.c_int]
    return load_or_warn(source("dropout.cpp"), "Dropout on CPU runs as F.dropout", None,
                        {name: argtypes for name in KERNELS.values()})


def dropout(x: torch.Tensor, seed: int, p: float) -> torch.Tensor:
    """``x · keep / (1 − p)`` (contiguous, ``x``'s shape and dtype) for a CPU tensor of a dtype in :data:`KERNELS`,
    ``0 < p < 1`` and a 64-bit ``seed``."""
    x = x.contiguous()
    y = torch.empty_like(x)
    getattr(library(), KERNELS[x.dtype])(x.data_ptr(), y.data_ptr(), x.numel(), seed % 2**64, p,
                                         torch.get_num_threads())
    return y
