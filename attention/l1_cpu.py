"""CPU kernels of exact L1-distance attention (EcoTransformer, Gao & Xu 2025, eq. 1; docs/design.md §2 "L1 attention").

Per head, with ``c = −λ/√d`` and a pad mask on the keys::

    S_ij = c ‖q_i − k_j‖₁ (+ mask),   P = softmax_j(S),   Y = P V                       (forward)
    dV = Pᵀ dY,   dP = dY Vᵀ,   dS_ij = P_ij (dP_ij − δ_i),   δ_i = dY_i · Y_i
    dq_i = c Σ_j dS_ij sign(q_i − k_j),   dk_j = −c Σ_i dS_ij sign(q_i − k_j)                (backward)

with ``sign(0) = 0`` (``torch.sign``). The two L1-specific contractions (``S`` from ``q, k``; ``dq, dk``
from ``dS``) are the vectorised C++ kernels of ``l1_cpu.cpp`` (:func:`distance`, :func:`sign_grad`),
n²d work each like a matmul; everything else is PyTorch (softmax, the ``P V``-type GEMMs).

:class:`L1AttentionFunction` is flash-style: it walks query chunks of ``chunk`` rows so that at most a few
``(B·H, chunk, n)`` blocks are alive (``budget`` elements each), saves only ``q, k, v, Y`` and the
log-sum-exp ``L_i`` for backward (never an n×n matrix), and recomputes ``P = exp(S − L)`` chunk by chunk
in backward. Attention dropout (training) drops entries of ``P`` with a mask drawn per chunk from a
seeded generator, regenerated in backward (``δ`` is unchanged: ``Σ_j P_ij dP_ij = dY_i · Y_i``).

Build: ``l1_cpu.cpp`` is compiled on first use with the system C++ compiler (``$CXX``, else ``c++``;
-O3, the SIMD flags of ``torch.backends.cpu.get_cpu_capability()`` and the matching vector size) into
``$LRA_KERNEL_CACHE`` (default ``~/.cache/lra-attention``), keyed by a hash of the source, the headers
it includes and the flags, and loaded with ``ctypes`` (no PyTorch headers: about a second of compiler time). Without a
compiler it raises; there is no silent fallback on CPU. Other devices use the PyTorch path of
:mod:`attention.scores`.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("l1_cpu.cpp")
SIMD_FLAGS = {  # ATen CPU capability: compiler flags and the kernels' vector size in bytes (one register)
    "AVX512": (["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mavx2", "-mfma"], 64),
    "AVX2": (["-mavx2", "-mfma"], 32),
}
BASELINE = ([], 16)  # any other capability: the baseline instruction set (SSE2 on x86-64, NEON on AArch64)


def simd() -> tuple[list[str], int]:
    """Flags and vector bytes for this process's ``torch.backends.cpu.get_cpu_capability()``
    (``ATEN_CPU_CAPABILITY=default|avx2`` lowers it); the kernel's register tiles follow the vector size."""
    return SIMD_FLAGS.get(torch.backends.cpu.get_cpu_capability(), BASELINE)


def vector_bytes() -> int:
    """The kernels' vector size: :func:`sign_grad` needs d padded to a multiple of ``vector_bytes() / itemsize``."""
    return simd()[1]


def cache_dir() -> Path:
    if "LRA_KERNEL_CACHE" in os.environ:
        return Path(os.environ["LRA_KERNEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lra-attention"


def local_headers(source: Path) -> list[Path]:
    """The headers beside ``source`` that it includes (``#include "name.h"``; one level, headers include none):
    :func:`build` hashes them with the source, so an edited header never loads a library built before it."""
    names = re.findall(r'^\s*#\s*include\s+"([^"]+)"', source.read_text(), flags=re.MULTILINE)
    return [source.with_name(name) for name in names]


def build(compiler: str | None = None, source: Path = SOURCE) -> Path:
    """Compile ``source`` (``l1_cpu.cpp``; also ``seqconv_cpu.cpp``, ``pinv_cpu.cpp`` and the ``landmarks_*cpu.cpp``)
    once per source, the headers it includes (:func:`local_headers`), flags and compiler, and return the library's
    path."""
    compiler = compiler or os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise RuntimeError(
            f"the CPU kernels compile on first use ({source.name}), but the C++ compiler "
            f"{compiler!r} was not found on PATH: install one (e.g. 'apt-get install g++') or set CXX to its path"
        )
    simd_flags, width = simd()
    flags = ["-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", *simd_flags, f"-DLRA_VECTOR_BYTES={width}"]
    text = b"".join(path.read_bytes() for path in [source, *local_headers(source)])
    key = hashlib.sha256(text + " ".join([compiler, *flags]).encode()).hexdigest()[:16]
    path = cache_dir() / f"{source.stem}-{key}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.so")
        command = [compiler, *flags, str(source), "-o", str(partial)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"compiling {source.name} failed: {' '.join(command)}\n{result.stderr[-3000:]}")
        os.replace(partial, path)  # atomic: concurrent first uses never load a half-written library
    return path


def load_or_warn(source: Path, instead: str) -> ctypes.CDLL | None:
    """``source`` built by :func:`build` and loaded, or None with a warning that ``instead`` runs (no compiler, or
    it failed): for kernels that have a PyTorch form to fall back on (the L1 kernels have none and raise)."""
    try:
        return ctypes.CDLL(str(build(source=source)))
    except RuntimeError as error:
        warnings.warn(f"{instead}: {str(error).splitlines()[0]}")
        return None


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """The compiled kernels (built by :func:`build` on first call)."""
    lib = ctypes.CDLL(str(build()))
    if lib.l1_vector_bytes() != vector_bytes():  # pad_columns pads to Python's width, the kernels read theirs
        raise RuntimeError(f"{SOURCE.name} was compiled for {lib.l1_vector_bytes()}-byte vectors, but "
                           f"l1_cpu.vector_bytes() is {vector_bytes()}: build() and vector_bytes() must agree")
    i64, ptr, threads = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    for suffix, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        getattr(lib, f"l1_distance_{suffix}").argtypes = [ptr, i64, ptr, ptr, i64, i64, i64, i64, real, threads]
        getattr(lib, f"l1_sign_grad_{suffix}").argtypes = [ptr, ptr, i64, ptr, ptr, ptr, i64, i64, i64, i64, real,
                                                           threads]
    return lib


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
    _kernel("l1_distance", q, kt, out)(q.data_ptr(), _rows_view(q), kt.data_ptr(), out.data_ptr(), problems, a, b, d, scale,
                              torch.get_num_threads())
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
    _kernel("l1_sign_grad", g, q, k, dq, dk)(g.data_ptr(), q.data_ptr(), _rows_view(q), k.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                               problems, a, b, d, scale, torch.get_num_threads())


def _keep(seed: int, start: int, shape: torch.Size, p: float, dtype: torch.dtype) -> torch.Tensor:
    """Dropout multipliers (0 or 1/(1 − p)) of the chunk starting at query ``start``, reproducible from ``seed``."""
    generator = torch.Generator().manual_seed(seed + start)
    return torch.rand(shape, generator=generator, dtype=dtype).ge_(p).div_(1.0 - p)


class L1AttentionFunction(torch.autograd.Function):
    """``softmax(−λ‖q_i − k_j‖₁/√d + pad mask) V`` for ``q, k, v`` ``(B, H, n, d)`` float32/float64 on CPU.

    ``key_mask`` bool ``(B, n)``; ``dropout`` p applied to ``P`` when > 0 (masks from ``seed``). Rows of a
    sequence without any real key are 0 (as :func:`attention.scores.masked_softmax`). Memory beyond the
    inputs: ``Y``, ``L`` and a few ``(B·H, chunk, n)`` blocks, ``chunk = budget // (B·H·n)``.
    """

    budget = 1 << 21

    @staticmethod
    def chunk_rows(problems: int, n: int) -> int:
        rows = L1AttentionFunction.budget // max(1, problems * n)
        return max(1, min(n, rows - rows % 8 if rows >= 8 else rows))  # whole 8-row tiles of the kernel

    @staticmethod
    def scores(q, kt, rows, scale, pad):
        """``S`` for query rows ``rows``: ``(B·H, chunk, n)``, pad keys at the lowest finite value."""
        s = distance(q[:, rows], kt, scale)
        if pad is not None:
            heads = s.shape[0] // pad.shape[0]
            s.view(pad.shape[0], heads, *s.shape[1:]).masked_fill_(pad[:, None, None, :], torch.finfo(s.dtype).min)
        return s

    @staticmethod
    def forward(ctx, q, k, v, key_mask, lam: float, dropout: float = 0.0, seed: int = 0):
        batch, heads, n, d = q.shape
        q, k, v = (x.reshape(batch * heads, n, d).contiguous() for x in (q, k, v))
        scale = -lam / math.sqrt(d)
        pad = None if bool(key_mask.all()) else ~key_mask
        kt = k.transpose(1, 2).contiguous()  # (B·H, d, n)
        out, lse = torch.empty_like(v), torch.empty(batch * heads, n, dtype=q.dtype)
        chunk = L1AttentionFunction.chunk_rows(batch * heads, n)
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            s = L1AttentionFunction.scores(q, kt, rows, scale, pad)
            top = s.amax(-1, keepdim=True)
            total = s.sub_(top).exp_().sum(-1, keepdim=True)
            lse[:, rows] = (top + total.log()).squeeze(-1)
            if dropout > 0:
                s.mul_(_keep(seed, start, s.shape, dropout, s.dtype))
            out[:, rows] = torch.bmm(s, v).div_(total)
        empty = ~key_mask.any(-1).repeat_interleave(heads)  # (B·H,): sequences with no real token
        if bool(empty.any()):
            out[empty], lse[empty] = 0.0, math.inf  # P = exp(S − ∞) = 0 in backward
        ctx.save_for_backward(q, k, v, out, lse, key_mask)
        ctx.setup = (batch, heads, scale, dropout, seed)
        return out.view(batch, heads, n, d)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse, key_mask = ctx.saved_tensors
        batch, heads, scale, dropout, seed = ctx.setup
        problems, n, d = q.shape
        grad_out = grad_out.reshape(problems, n, d).to(q.dtype).contiguous()
        delta = (grad_out * out).sum(-1)  # δ_i = dY_i · Y_i, (B·H, n)
        pad = None if bool(key_mask.all()) else ~key_mask
        kt = k.transpose(1, 2).contiguous()
        q_padded, k_padded = pad_columns(q), pad_columns(k)
        grad_q, grad_k, grad_v = torch.empty_like(q_padded), torch.zeros_like(k_padded), torch.zeros_like(v)
        chunk = L1AttentionFunction.chunk_rows(problems, n)
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            p = L1AttentionFunction.scores(q, kt, rows, scale, pad).sub_(lse[:, rows, None]).exp_()  # P rows
            grad_p = torch.bmm(grad_out[:, rows], v.transpose(1, 2))  # dY Vᵀ
            if dropout > 0:
                keep = _keep(seed, start, p.shape, dropout, p.dtype)
                grad_p.mul_(keep)
                grad_v.baddbmm_(keep.mul_(p).transpose(1, 2), grad_out[:, rows])
            else:
                grad_v.baddbmm_(p.transpose(1, 2), grad_out[:, rows])
            grad_s = grad_p.sub_(delta[:, rows, None]).mul_(p)  # dS = P ⊙ (dP − δ)
            sign_grad(grad_s, q_padded[:, rows], k_padded, grad_q[:, rows], grad_k, scale)
        shape = (batch, heads, n, d)
        grads = (grad_q[..., :d].reshape(shape), grad_k[..., :d].reshape(shape), grad_v.view(shape))
        return (*grads, None, None, None, None)
