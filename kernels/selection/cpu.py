"""Bindings of ``cpu.cpp``, CUR's landmark selection on CPU (float32; the method: :mod:`attention.selection`;
the plain PyTorch reference: :mod:`kernels.selection.naive`). Not differentiated: no autograd node.

* :func:`abs_row_sums` ``Σ_e |x_ie|`` ``(B, H, n)`` from ``x`` ``(B, H, n, d)``: one pass over ``x``, where
  ``x.abs().sum(-1)`` writes and rereads a full-size ``|X|`` (CUR paper §7.1, the ``abs`` rule);
* :func:`top_indices`, the landmarks of given priorities (:func:`attention.selection._top`) by one selection and
  one scan per row, where PyTorch runs a dozen sequence-sized operations.

Backend: the conditions of the landmark kernels (:func:`kernels.landmark_attention.cpu.kernel_takes`: float32 CPU
tensors with contiguous rows, eager, no dispatch mode, the libraries built), checked once in each function; anything
else runs the PyTorch forms.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from kernels.common.build import I64, PTR, load_or_warn, source
from kernels.landmark_attention.cpu import kernel_takes, strides_of


@functools.lru_cache(maxsize=None)
def selection_library() -> ctypes.CDLL | None:
    """The selection kernels (``cpu.cpp``), or None (with a warning) without a compiler."""
    return load_or_warn(source("selection/cpu.cpp"), "CUR's selection runs its PyTorch form",
                        "landmarks_selection_vector_bytes", {
                            "landmarks_abs_row_sums_f32": [PTR] * 3 + [I64] * 4 + [ctypes.c_int],
                            "landmarks_top_indices_f32": [PTR] * 3 + [I64] * 4 + [ctypes.c_int] * 2,
                        }, ctypes.c_int)


def abs_row_sums(x: torch.Tensor) -> torch.Tensor:
    """``x.abs().sum(-1)`` ``(B, H, n)`` for ``x`` ``(B, H, n, d)`` (any strides), by the kernel where it applies."""
    if x.dim() != 4 or not kernel_takes(x) or selection_library() is None:
        return x.abs().sum(-1)
    batch, heads, n, d = x.shape
    out = x.new_empty(batch, heads, n)
    selection_library().landmarks_abs_row_sums_f32(x.data_ptr(), strides_of(x), out.data_ptr(), batch, heads, n, d,
                                                   torch.get_num_threads())
    return out


def top_indices(priority: torch.Tensor, key_mask: torch.Tensor, m: int, force_cls: bool) -> torch.Tensor | None:
    """:func:`attention.selection._top` of float32 ``priority`` ``(B, H, n)`` by the kernel (one selection and one
    scan per row), or None where the kernel does not apply (the caller runs the PyTorch form)."""
    if not (kernel_takes(priority) and priority.dim() == 3 and 1 <= m <= priority.shape[-1]
            and selection_library() is not None):
        return None
    batch, heads, n = priority.shape
    priority, real = priority.contiguous(), key_mask.contiguous()
    out = torch.empty(batch, heads, m, dtype=torch.int64)
    selection_library().landmarks_top_indices_f32(priority.data_ptr(), real.data_ptr(), out.data_ptr(), batch, heads,
                                                  n, m, int(force_cls), torch.get_num_threads())
    return out
