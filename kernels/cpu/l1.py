"""Bindings of ``l1.cpp``, the two L1-specific contractions of exact L1-distance attention (EcoTransformer,
Gao & Xu 2025, eq. 1; the attention and its autograd: :mod:`attention.l1_cpu`), float32 and float64 on CPU:

* :func:`distance` ``out[p, i, j] = scale · ‖q[p, i] − k[p, j]‖₁``;
* :func:`sign_grad` ``dq[p, i] = scale Σ_j g_pij sign(q_pi − k_pj)``, ``dk[p, j] −= scale Σ_i g_pij sign(…)``.

Both are n²d work like a matmul, in register tiles of the vector size (:func:`kernels.cpu.build.vector_bytes`).
They have no PyTorch form to fall back on: without a compiler the first call raises.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from kernels.cpu.build import I64, PTR, load, source, vector_bytes


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """The compiled kernels (built on first call; raises without a compiler)."""
    signatures = {}
    for suffix, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        signatures[f"l1_distance_{suffix}"] = [PTR, I64, PTR, PTR, I64, I64, I64, I64, real, ctypes.c_int]
        signatures[f"l1_sign_grad_{suffix}"] = [PTR, PTR, I64, PTR, PTR, PTR, I64, I64, I64, I64, real, ctypes.c_int]
    return load(source("l1.cpp"), "l1_vector_bytes", signatures)


def _kernel(name: str, *tensors: torch.Tensor):
    """The kernel ``name`` for the dtype of ``tensors`` (all float32 or all float64, on CPU: raw pointers follow)."""
    kinds = {(x.dtype, x.device.type) for x in tensors}
    if kinds not in ({(torch.float32, "cpu")}, {(torch.float64, "cpu")}):
        raise ValueError(f"the L1 CPU kernels take CPU tensors, all float32 or all float64; got {sorted(map(str, kinds))}")
    return getattr(library(), f"{name}_{'f32' if tensors[0].dtype == torch.float32 else 'f64'}")


def _rows_view(x: torch.Tensor) -> int:
    """Elements between problems of ``x`` ``(P, rows, d)`` whose rows are contiguous (e.g. a row slice)."""
    if x.stride(-1) != 1 or x.stride(-2) != x.shape[-1]:
        raise ValueError(f"expected rows of contiguous d-vectors, got strides {x.stride()} for shape {tuple(x.shape)}")
    return x.stride(0)


def distance(q: torch.Tensor, kt: torch.Tensor, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``out[p, i, j] = scale · ‖q[p, i] − k[p, j]‖₁`` ``(P, a, b)`` from ``q`` ``(P, a, d)`` (rows contiguous,
    e.g. a row slice) and the transposed keys ``kt`` ``(P, d, b)`` (contiguous)."""
    problems, a, d = q.shape
    b = kt.shape[-1]
    kt = kt.contiguous()
    out = torch.empty(problems, a, b, dtype=q.dtype) if out is None else out
    if kt.shape != (problems, d, b) or out.shape != (problems, a, b) or not out.is_contiguous():
        raise ValueError(f"distance: q {tuple(q.shape)}, kt {tuple(kt.shape)}, out {tuple(out.shape)} do not match")
    _kernel("l1_distance", q, kt, out)(q.data_ptr(), _rows_view(q), kt.data_ptr(), out.data_ptr(), problems, a, b, d,
                                       scale, torch.get_num_threads())
    return out


def pad_columns(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(..., d)`` contiguous, zero-padded to a multiple of the vector width (sign(0 − 0) = 0 adds nothing)."""
    width = vector_bytes() // x.element_size()
    extra = -x.shape[-1] % width
    return torch.nn.functional.pad(x, (0, extra)).contiguous() if extra else x.contiguous()


def sign_grad(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, scale: float):
    """``dq[p, i] = scale Σ_j g_pij sign(q_pi − k_pj)`` (written), ``dk[p, j] −= scale Σ_i g_pij sign(…)``.

    ``g`` ``(P, a, b)`` contiguous; ``q``, ``dq`` ``(P, a, d)`` with contiguous rows (may be row slices of
    the same stride); ``k``, ``dk`` ``(P, b, d)`` contiguous; ``d`` a multiple of :func:`pad_columns`' width.
    """
    problems, a, d = q.shape
    b = k.shape[1]
    if (d * q.element_size()) % vector_bytes() or _rows_view(q) != _rows_view(dq) or not k.is_contiguous():
        raise ValueError(f"sign_grad: pad d ({d}) with pad_columns, give q and dq the same strides, contiguous k")
    if not (g.is_contiguous() and dk.is_contiguous() and g.shape == (problems, a, b) and dk.shape == k.shape
            and dq.shape == q.shape and k.shape == (problems, b, d)):
        raise ValueError(f"sign_grad: g {tuple(g.shape)}, k {tuple(k.shape)}, dk {tuple(dk.shape)} do not match")
    _kernel("l1_sign_grad", g, q, k, dq, dk)(g.data_ptr(), q.data_ptr(), _rows_view(q), k.data_ptr(), dq.data_ptr(),
                                             dk.data_ptr(), problems, a, b, d, scale, torch.get_num_threads())
