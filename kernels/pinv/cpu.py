"""Bindings of ``cpu.cpp``, the iterative pseudo-inverse's steps on CPU (float32; the method: :mod:`attention.pinv`).

:func:`iterate` runs the ``n_iter`` steps ``Z ← Z · ¼ (13I − AZ(15I − AZ(7I − AZ)))`` of every ``m × m`` problem in
one call, optionally keeping each step's ``(Z, AZ, W, inner, S)`` for :func:`iterate_backward`, the same chain
rule as :class:`kernels.pinv.ops.Iterations` (the equations are in the C++ file). ATen runs the same products as
24 calls per forward and 48 per backward (6 steps), each a batched GEMM with its dispatch, and copies the identity
for every diagonal term.

Same conditions as the attention kernels of :mod:`kernels.landmark_attention` (float32 CPU tensors, eager, no
dispatch mode, the library built), and ``m`` a power of two times the vector width, at most 128 (CUR's and
Nyström's 64 landmarks); anything else runs the PyTorch form.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from kernels.common.build import I64, PTR, load_or_warn, source
from kernels.landmark_attention import MAX_KEYS, kernel_takes, vector_floats

STEP_MATRICES = 5  # (Z, AZ, W, inner, S) kept per step for the backward


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """The kernel (``cpu.cpp``), or None (with a warning) without a compiler."""
    return load_or_warn(source("pinv/cpu.cpp"), "the pseudo-inverse runs its PyTorch form", "pinv_vector_bytes", {
        "pinv_iterate_f32": [PTR] * 4 + [I64] * 2 + [ctypes.c_int] * 2,
        "pinv_iterate_backward_f32": [PTR] * 5 + [I64] * 2 + [ctypes.c_int] * 2,
    }, ctypes.c_int)


def takes(a: torch.Tensor) -> bool:
    """Whether the kernel runs the steps on ``a`` ``(P, m, m)`` (and a start of its dtype and device): float32 CPU
    tensors outside compile and dispatch modes, ``m / vector width`` a power of two and ``m ≤ 128``, the library
    built."""
    if not kernel_takes(a):  # first: nothing else is traced under torch.compile
        return False
    m, width = a.shape[-1], vector_floats()
    return m % width == 0 and m <= MAX_KEYS and (m // width).bit_count() == 1 and library() is not None


def iterate(a: torch.Tensor, z: torch.Tensor, n_iter: int, keep: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(Z_last, saved)`` after ``n_iter`` steps from ``Z_0 = z`` for ``a`` ``(P, m, m)``; ``saved``
    ``(P, n_iter, 5, m, m)`` the steps' matrices when ``keep``, else None."""
    a, z = a.contiguous(), z.contiguous()
    problems, m = a.shape[0], a.shape[-1]
    out = torch.empty_like(a)
    saved = a.new_empty(problems, n_iter, STEP_MATRICES, m, m) if keep else None
    status = library().pinv_iterate_f32(a.data_ptr(), z.data_ptr(), out.data_ptr(),
                                        saved.data_ptr() if keep else None, problems, m, n_iter,
                                        torch.get_num_threads())
    if status:
        raise ValueError(f"kernels.pinv.cpu: m={m} or n_iter={n_iter} is not supported by the kernel")
    return out, saved


def iterate_backward(a: torch.Tensor, saved: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dA, dZ_0)`` of :func:`iterate` from ``grad`` ``(P, m, m)``, the gradient of ``Z_last``."""
    a, grad = a.contiguous(), grad.contiguous()
    problems, n_iter, _, m, _ = saved.shape
    grad_a, grad_z = torch.empty_like(a), torch.empty_like(a)
    status = library().pinv_iterate_backward_f32(a.data_ptr(), saved.data_ptr(), grad.data_ptr(), grad_a.data_ptr(),
                                                 grad_z.data_ptr(), problems, m, n_iter, torch.get_num_threads())
    if status:
        raise ValueError(f"kernels.pinv.cpu: m={m} or n_iter={n_iter} is not supported by the backward kernel")
    return grad_a, grad_z
