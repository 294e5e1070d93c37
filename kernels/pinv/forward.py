"""Forward kernel of the fused pseudo-inverse (Nyströmformer eq. 16; docs/design.md §2 "Pseudo-inverse").

One program per ``m × m`` problem ``A`` (a batch row × head of CUR's ``U`` or Nyström's kernel), the whole
problem in registers as one ``BLOCK × BLOCK`` float32 tile (``BLOCK = max(16, next_pow2(m))``, the rows and
columns past ``m`` zero)::

    Z₀ = Aᵀ / max(‖A‖₁ ‖A‖∞, tiny)               max column sum × max row sum of |A| (per_head),
                                                or one norm for every problem (global, passed in)
    AZ = A Z,  W = 7I − AZ,  inner = 15I − AZ W,  S = 3.25I − ¼ AZ inner,  Z ← Z S     n_iter times

Four products per step (:func:`mm`), O(n_iter · m³) per problem, float32 ``tl.dot`` in :data:`PRECISION`: 3xTF32,
each product as three TF32 products of the operands' high and low parts on the tensor cores (~22 mantissa bits;
within the float32 tolerances of ``tests/kernels/test_pinv_triton_kernels.py``, whose interpreter runs emulate it).
Plain TF32's 10-bit mantissa stalls the iteration at ~1e-3; IEEE dots run on the FMA units, where each thread holds
its operands' whole K extent in registers (the forward spilled at m = 64; :mod:`kernels.pinv.launch`). The backward
(:mod:`kernels.pinv.backward`) keeps IEEE dots: in tensor-core dots its seven live tiles spill kilobytes. Zero
padding is exact: the norms of the padded matrix are ``A``'s, and every iterate keeps zero rows and columns past
``m`` (``S`` is ``3.25 I`` there).

``_pinv_fwd`` writes ``Z_{n_iter}`` and, when ``SAVE`` (autograd will need it), the step inputs
``Z_1 … Z_{n_iter−1}`` (``Z₀`` is recomputed from ``A``), what :mod:`kernels.pinv.backward` reads. The
shared pieces (:func:`load_square`, :func:`norms`, :func:`inner_term`, :func:`step_term`) serve both kernels.
Layouts: ``A, Z`` ``(P, m, m)`` contiguous, ``SAVED`` ``(P, n_iter − 1, m, m)`` contiguous, ``NORM`` one
float32 (global init). Offsets are int64 (``P · n_iter · m²`` may pass 2³¹).
"""

from __future__ import annotations

import triton
import triton.language as tl

# torch.finfo(torch.float32).tiny: the clamp of the norm product (kernels.pinv.ops.start_norm)
TINY = tl.constexpr(1.1754943508222875e-38)
PRECISION = tl.constexpr("tf32x3")  # the forward's products (module doc); lra.bench's time model reads it


@triton.jit
def _split_k(a, b):
    """``A = [A₀ A₁]``, ``B = [B₀; B₁]`` by interleaved halves of the K dimension (A's even/odd columns, B's rows)."""
    a0, a1 = tl.split(tl.reshape(a, [a.shape[0], a.shape[1] // 2, 2]))
    b0, b1 = tl.split(tl.permute(tl.reshape(b, [b.shape[0] // 2, 2, b.shape[1]]), (0, 2, 1)))
    return a0, a1, b0, b1


@triton.jit
def _mm_k32(a, b, acc):
    """``acc + A B`` for K ≤ 32, as two dots of K = 16 when K = 32."""
    if a.shape[1] > 16:
        a0, a1, b0, b1 = _split_k(a, b)
        acc = tl.dot(a1, b1, tl.dot(a0, b0, acc, input_precision="ieee"), input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    return acc


@triton.jit
def mm(a, b, PRECISION: tl.constexpr):
    """``a @ b`` of float32 tiles, accumulated in float32. ``"ieee"``: dots of K = 16 on the FMA units, where each
    thread holds its operand rows and columns over the whole K in registers, so shorter K means fewer live registers
    (at K = 64 and 32; K ≤ 64 here). Otherwise one ``tl.dot`` of that ``input_precision`` on the tensor cores."""
    if PRECISION == "ieee":
        acc = tl.zeros([a.shape[0], b.shape[1]], tl.float32)
        if a.shape[1] > 32:
            a0, a1, b0, b1 = _split_k(a, b)
            acc = _mm_k32(a1, b1, _mm_k32(a0, b0, acc))
        else:
            acc = _mm_k32(a, b, acc)
    else:
        acc = tl.dot(a, b, input_precision=PRECISION)
    return acc


@triton.jit
def square_offsets(M, BLOCK: tl.constexpr):
    """Row-major offsets of an ``m × m`` matrix in a ``BLOCK × BLOCK`` tile, the in-bounds mask, the identity."""
    offs = tl.arange(0, BLOCK)
    inside = (offs[:, None] < M) & (offs[None, :] < M)
    return offs[:, None] * M + offs[None, :], inside, offs[:, None] == offs[None, :]


@triton.jit
def load_square(ptr, square, inside):
    return tl.load(ptr + square, mask=inside, other=0.0)


@triton.jit
def norms(a):
    """Column sums and row sums of ``|A|`` (vectors) and their maxima ``‖A‖₁``, ``‖A‖∞``."""
    absolute = tl.abs(a)
    col_sums = tl.sum(absolute, 0)
    row_sums = tl.sum(absolute, 1)
    return col_sums, row_sums, tl.max(col_sums, 0), tl.max(row_sums, 0)


@triton.jit
def start_norm(a, NORM, HAS_NORM: tl.constexpr):
    """The scale of ``Z₀ = Aᵀ / norm``: the global norm passed in, or ``max(‖A‖₁ ‖A‖∞, tiny)``."""
    if HAS_NORM:
        norm = tl.load(NORM)
    else:
        _, _, col, row = norms(a)
        norm = tl.maximum(col * row, TINY)
    return norm


@triton.jit
def inner_term(az, eye, PRECISION: tl.constexpr):
    """``inner = 15I − AZ W`` with ``W = 7I − AZ`` (``W`` only lives inside this product)."""
    return tl.where(eye, 15.0, 0.0) - mm(az, tl.where(eye, 7.0 - az, -az), PRECISION)


@triton.jit
def step_term(az, inner, eye, PRECISION: tl.constexpr):
    """``S = 3.25I − ¼ AZ inner``: one Newton–Schulz step is ``Z ← Z S``."""
    return tl.where(eye, 3.25, 0.0) - 0.25 * mm(az, inner, PRECISION)


@triton.jit
def _pinv_fwd(A, NORM, Z, SAVED, M, N_ITER, BLOCK: tl.constexpr, HAS_NORM: tl.constexpr, SAVE: tl.constexpr):
    """One program: problem ``program_id(0)``, init and all ``N_ITER`` steps."""
    pid = tl.program_id(0).to(tl.int64)
    square, inside, eye = square_offsets(M, BLOCK)
    size = M * M
    a = load_square(A + pid * size, square, inside)
    z = tl.trans(a) / start_norm(a, NORM, HAS_NORM)
    saved = SAVED + pid * (N_ITER - 1) * size
    for k in range(N_ITER):
        if SAVE:
            if k > 0:
                tl.store(saved + (k - 1) * size + square, z, mask=inside)
        az = mm(a, z, PRECISION)
        z = mm(z, step_term(az, inner_term(az, eye, PRECISION), eye, PRECISION), PRECISION)
    tl.store(Z + pid * size + square, z, mask=inside)
