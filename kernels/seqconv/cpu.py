"""Nyström's depthwise sequence conv (:class:`attention.nystrom.SequenceConv`; docs/design.md §2) and its landmarks'
segment sums on CPU (float32 and float64): the bindings of ``cpu.cpp`` and their autograd nodes
(:class:`ConvFunction`, :class:`SegmentSums`). The plain PyTorch reference: :mod:`kernels.seqconv.naive`.

Per head ``h`` with kernel ``w[h]`` of odd size ``K`` and pad mask ``m``::

    y_i = base_i + Σ_t w[h, t] · m_j x_j,   j = i + t − K//2   (zero outside the sequence)
    ∂x_j = m_j Σ_t w[h, t] g_{j − t + K//2},   ∂w[h, t] = Σ_{b,i} m_j (g_i · x_j),   ∂base = g
    sums[b, h, s] = Σ_{i: segment[b, i] = s} x[b, h, i]

in register tiles that load each input row once for all outputs it reaches, reading any layout whose rows are
contiguous (the model's ``(B, n, H, d)`` memory needs no copy) and writing the sum with ``base`` in one pass; the
gradient of x is the same conv with the reversed kernel, masked on output.

Whether the kernels can run, :func:`uses_kernel` (the method asks only in its ``cpu`` form, :mod:`attention.impl`): without a compiler :func:`library` warns once and is None
(:mod:`kernels.common.build`); the caller then runs the banded matrix products, as on other devices and under
``torch.compile`` (a ctypes call would break the graph). Measured: docs/bench.md ("CUR's backward without full-size
copies, and Nyström's sequence kernels").
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from kernels.common.build import I64, PTR, load_or_warn, source

@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """``cpu.cpp`` built and loaded, or None (with a warning) without a compiler."""
    signatures = {}
    for suffix in ("f32", "f64"):
        signatures[f"seqconv_{suffix}"] = [PTR, I64, I64, I64, PTR, PTR, PTR, PTR, I64, I64, I64, PTR, I64, I64, I64,
                                           I64, I64, I64, I64, I64, ctypes.c_int]
        signatures[f"seqconv_weight_grad_{suffix}"] = [PTR, I64, I64, I64, PTR, I64, I64, I64, PTR, PTR, I64, I64,
                                                       I64, I64, I64, ctypes.c_int]
        signatures[f"segment_sums_{suffix}"] = [PTR, I64, I64, I64, PTR, PTR, I64, I64, I64, I64, I64, ctypes.c_int]
    return load_or_warn(source("seqconv/cpu.cpp"), "Nyström's conv runs as banded matrix products", None, signatures)


def uses_kernel(x: torch.Tensor) -> bool:
    """CPU float tensors with contiguous rows, outside ``torch.compile`` and dispatch modes (``FlopCounterMode``
    counts the banded products instead: a ctypes call is invisible to it), and the library built."""
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.stride(-1) == 1
            and not torch.compiler.is_compiling() and not is_in_torch_dispatch_mode() and library() is not None)


def _ptr(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


def _suffix(x: torch.Tensor) -> str:
    return "f32" if x.dtype == torch.float32 else "f64"


def conv(x, weight, in_mask=None, out_mask=None, base=None, out=None) -> torch.Tensor:
    """``base + out_mask ⊙ conv(x ⊙ in_mask)`` ``(B, H, n, d)`` (rows of ``x`` and ``base`` contiguous; masks
    ``(B, n)`` contiguous in ``x``'s dtype or None; ``weight`` ``(H, K)``); the result takes ``base``'s layout, else
    ``x``'s, or is written into ``out`` (which may be ``base``: row i of the result reads row i of ``base`` only)."""
    batch, heads, n, d = x.shape
    y = out if out is not None else torch.empty_like(base if base is not None else x)
    weight = weight.contiguous()
    strides = lambda t: (0, 0, 0) if t is None else t.stride()[:3]  # noqa: E731
    getattr(library(), f"seqconv_{_suffix(x)}")(
        x.data_ptr(), *strides(x), weight.data_ptr(), _ptr(in_mask), _ptr(out_mask), _ptr(base), *strides(base),
        y.data_ptr(), *strides(y), batch, heads, n, d, weight.shape[-1], torch.get_num_threads())
    return y


def weight_grad(grad: torch.Tensor, x: torch.Tensor, mask: torch.Tensor | None, size: int) -> torch.Tensor:
    """``∂w[h, t] = Σ_{b,i} g_i · (x ⊙ mask)_{i+t−K//2}`` ``(H, K)`` of :func:`conv` for kernel size ``size``, from
    ``grad`` and ``x`` ``(B, H, n, d)`` with contiguous rows."""
    batch, heads, n, d = x.shape
    partial = torch.empty(batch, heads, size, dtype=x.dtype)
    getattr(library(), f"seqconv_weight_grad_{_suffix(x)}")(
        grad.data_ptr(), *grad.stride()[:3], x.data_ptr(), *x.stride()[:3], _ptr(mask), partial.data_ptr(),
        batch, heads, n, d, size, torch.get_num_threads())
    return partial.sum(0)


def segment_sums(x: torch.Tensor, segment: torch.Tensor, m: int) -> torch.Tensor:
    """``sums[b, h, s] = Σ_{i: segment[b, i] = s} x[b, h, i]`` ``(B, H, m, d)`` for ``x`` ``(B, H, n, d)`` (rows
    contiguous) and long ``segment`` ``(B, n)``; rows whose segment is outside ``[0, m)`` are left out."""
    batch, heads, n, d = x.shape
    segment = segment.contiguous()
    sums = x.new_empty(batch, heads, m, d)
    getattr(library(), f"segment_sums_{_suffix(x)}")(x.data_ptr(), *x.stride()[:3], segment.data_ptr(),
                                                     sums.data_ptr(), batch, heads, n, d, m, torch.get_num_threads())
    return sums



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
        if grad.stride(-1) != 1:
            grad = grad.contiguous()
        grad_x = conv(grad, weight.flip(-1), out_mask=mask) if ctx.needs_input_grad[0] else None
        grad_w = weight_grad(grad, x, mask, weight.shape[-1]) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, grad if ctx.needs_input_grad[3] else None


class SegmentSums(torch.autograd.Function):
    """``sums[b, h, s] = Σ_{i: segment[b, i] = s} x[b, h, i]`` ``(B, H, m, d)`` for ``x`` ``(B, H, n, d)`` (rows
    contiguous) and long ``segment`` ``(B, n)``; rows whose segment is outside ``[0, m)`` (padding) are left out.
    One pass over ``x`` in any layout (:func:`segment_sums`), where a ``scatter_add`` reads an
    index per element; backward gives each row its segment's gradient (0 for left-out rows)."""

    @staticmethod
    def forward(ctx, x, segment, m: int):
        segment = segment.contiguous()
        ctx.save_for_backward(segment)
        return segment_sums(x, segment, m)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (segment,) = ctx.saved_tensors
        batch, heads, m, d = grad.shape
        padded = torch.cat([grad, grad.new_zeros(batch, heads, 1, d)], 2)  # segment m (and beyond): 0
        outside = (segment < 0) | (segment >= m)  # left out of the sums, as in the forward: gradient 0
        index = segment.masked_fill(outside, m)[:, None, :, None].expand(batch, heads, segment.shape[-1], d)
        return padded.gather(2, index), None, None
