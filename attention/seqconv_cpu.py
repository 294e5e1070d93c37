"""CPU kernels of Nyström's depthwise sequence conv (:class:`attention.nystrom.SequenceConv`; docs/design.md §2) and
of its landmarks' segment sums (:class:`SegmentSums`).

Per head ``h`` with kernel ``w[h]`` of odd size ``K`` and pad mask ``m``::

    y_i = base_i + Σ_t w[h, t] · m_j x_j,   j = i + t − K//2   (zero outside the sequence)
    ∂x_j = m_j Σ_t w[h, t] g_{j − t + K//2},   ∂w[h, t] = Σ_{b,i} m_j (g_i · x_j),   ∂base = g

``seqconv_cpu.cpp`` computes the conv (the gradient of x is the same conv with the reversed kernel, masked on
output) and the weight gradient with register tiles that load each input row once for all outputs it reaches,
reading any layout whose rows are contiguous (the model's (B, n, H, d) memory needs no copy) and writing the sum
with ``base`` in one pass.
Built like the L1 kernels (:func:`attention.l1_cpu.build`: the system compiler, this instruction set's flags,
cached); without a compiler :class:`attention.nystrom.SequenceConv` warns once and runs its banded matrix
products instead, as it does on other devices and under ``torch.compile`` (ctypes would break the graph).
Measured (n = 4096, B = 8, H = 2, d = 32, K = 35, one thread, busy machine): forward 5.7 vs 11.9 ms,
forward + backward 16.5 vs 38.6 ms for the banded products; the tiles loading each input row once (2026-11-25)
took the conv from 3.5 to 1.8 ms and the weight gradient from 5.6 to 3.0 ms (docs/bench.md).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from attention import l1_cpu

SOURCE = Path(__file__).with_name("seqconv_cpu.cpp")
CPU_KERNEL = True  # False runs the banded products on CPU too (tests compare the two)


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """``seqconv_cpu.cpp`` built by :func:`attention.l1_cpu.build`, or None (with a warning) without a compiler."""
    lib = l1_cpu.load_or_warn(SOURCE, "Nyström's conv runs as banded matrix products")
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for suffix in ("f32", "f64"):
        getattr(lib, f"seqconv_{suffix}").argtypes = [ptr, i64, i64, i64, ptr, ptr, ptr, ptr, i64, i64, i64, ptr, i64,
                                                      i64, i64, i64, i64, i64, i64, i64, ctypes.c_int]
        getattr(lib, f"seqconv_weight_grad_{suffix}").argtypes = [ptr, i64, i64, i64, ptr, i64, i64, i64, ptr, ptr,
                                                                  i64, i64, i64, i64, i64, ctypes.c_int]
        getattr(lib, f"segment_sums_{suffix}").argtypes = [ptr, i64, i64, i64, ptr, ptr, i64, i64, i64, i64, i64,
                                                           ctypes.c_int]
    return lib


def uses_kernel(x: torch.Tensor) -> bool:
    """CPU float tensors with contiguous rows, outside ``torch.compile`` and dispatch modes (``FlopCounterMode``
    counts the banded products instead: a ctypes call is invisible to it), and the library built."""
    return (CPU_KERNEL and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.stride(-1) == 1
            and not torch.compiler.is_compiling() and not is_in_torch_dispatch_mode() and library() is not None)


def _ptr(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


def conv(x, weight, in_mask=None, out_mask=None, base=None, out=None) -> torch.Tensor:
    """``base + out_mask ⊙ conv(x ⊙ in_mask)`` ``(B, H, n, d)`` by ``seqconv_cpu.cpp`` (rows of ``x`` and ``base``
    contiguous; masks ``(B, n)`` contiguous in ``x``'s dtype or None; ``weight`` ``(H, K)``); the result takes
    ``base``'s layout, else ``x``'s, or is written into ``out`` (which may be ``base``: row i of the result reads
    row i of ``base`` only)."""
    batch, heads, n, d = x.shape
    y = out if out is not None else torch.empty_like(base if base is not None else x)
    suffix = "f32" if x.dtype == torch.float32 else "f64"
    weight = weight.contiguous()
    strides = lambda t: (0, 0, 0) if t is None else t.stride()[:3]  # noqa: E731
    getattr(library(), f"seqconv_{suffix}")(
        x.data_ptr(), *strides(x), weight.data_ptr(), _ptr(in_mask), _ptr(out_mask), _ptr(base), *strides(base),
        y.data_ptr(), *strides(y), batch, heads, n, d, weight.shape[-1], torch.get_num_threads())
    return y


class ConvFunction(torch.autograd.Function):
    """``base + conv(x ⊙ mask)`` by the CPU kernels: backward is the same conv of the gradient with the reversed
    kernel, masked on output, and ``∂/∂w[h, t] = Σ_{b,i} g_i · (x ⊙ mask)_{i+t−K//2}`` (``seqconv_weight_grad``)."""

    @staticmethod
    def forward(ctx, x, weight, mask, base):
        ctx.save_for_backward(x, weight, mask)
        return conv(x, weight, in_mask=mask, base=base)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight, mask = ctx.saved_tensors
        batch, heads, n, d = x.shape
        if grad.stride(-1) != 1:
            grad = grad.contiguous()
        grad_x = conv(grad, weight.flip(-1), out_mask=mask) if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            partial = torch.empty(batch, heads, weight.shape[-1], dtype=x.dtype)
            getattr(library(), f"seqconv_weight_grad_{'f32' if x.dtype == torch.float32 else 'f64'}")(
                grad.data_ptr(), *grad.stride()[:3], x.data_ptr(), *x.stride()[:3], _ptr(mask), partial.data_ptr(),
                batch, heads, n, d, weight.shape[-1], torch.get_num_threads())
            grad_w = partial.sum(0)
        return grad_x, grad_w, None, grad if ctx.needs_input_grad[3] else None


class SegmentSums(torch.autograd.Function):
    """``sums[b, h, s] = Σ_{i: segment[b, i] = s} x[b, h, i]`` ``(B, H, m, d)`` for ``x`` ``(B, H, n, d)`` (rows
    contiguous) and long ``segment`` ``(B, n)``; rows whose segment is outside ``[0, m)`` (padding) are left out.
    One pass over ``x`` in any layout (``segment_sums`` of ``seqconv_cpu.cpp``), where a ``scatter_add`` reads an
    index per element; backward gives each row its segment's gradient (0 for left-out rows)."""

    @staticmethod
    def forward(ctx, x, segment, m: int):
        batch, heads, n, d = x.shape
        segment = segment.contiguous()
        sums = x.new_empty(batch, heads, m, d)
        suffix = "f32" if x.dtype == torch.float32 else "f64"
        getattr(library(), f"segment_sums_{suffix}")(x.data_ptr(), *x.stride()[:3], segment.data_ptr(),
                                                     sums.data_ptr(), batch, heads, n, d, m, torch.get_num_threads())
        ctx.save_for_backward(segment)
        return sums

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (segment,) = ctx.saved_tensors
        batch, heads, m, d = grad.shape
        padded = torch.cat([grad, grad.new_zeros(batch, heads, 1, d)], 2)  # segment m (and beyond): 0
        index = segment.clamp(0, m)[:, None, :, None].expand(batch, heads, segment.shape[-1], d)
        return padded.gather(2, index), None, None
