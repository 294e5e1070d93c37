"""Forward kernel of the fused pseudo-inverse (Nyströmformer eq. 16; docs/design.md §2 "Pseudo-inverse").

One program per ``m × m`` problem ``A`` (a batch row × head of CUR's ``U`` or Nyström's kernel), all ``n_iter``
steps in that program::

    Z₀ = Aᵀ / max(‖A‖₁ ‖A‖∞, tiny)               max column sum × max row sum of |A| (per_head),
                                                or one norm for every problem (global, passed in)
    AZ = A Z,  W = 7I − AZ,  inner = 15I − AZ W,  S = 3.25I − ¼ AZ inner,  Z ← Z S     n_iter times

Four products per step, O(n_iter · m³) per problem. Each product (:func:`product`) reads its operands from global
memory, where the program has just written them (:func:`publish`: a store between two CTA barriers), ``K_CHUNK``
columns of the left and rows of the right operand at a time, into one ``BLOCK × BLOCK`` float32 accumulator
(``BLOCK = max(16, next_pow2(m))``, rows and columns past ``m`` masked to zero): a thread holds the accumulator
and two ``K_CHUNK``-wide slices, not both operands over all of K. (With the operands held in registers as whole
tiles, a 64 × 64 × 64 product in 3xTF32 dots alone took 147 registers at 8 warps on sm_90 and spilled on sm_80;
the kernels spilled 0.9–3.2 KB per thread: docs/bench.md.) The operands are 16 KiB each at m = 64 and were written
by the same SM a moment before, so they are read from its L1 or the L2, not HBM. The dots are float32 ``tl.dot``
in :data:`PRECISION`: 3xTF32, each product as three TF32 products of the operands' high and low parts on the tensor
cores (~22 mantissa bits; within the float32 tolerances of ``tests/kernels/test_pinv_triton_kernels.py``, whose
interpreter runs emulate it); plain TF32's 10-bit mantissa stalls the iteration at ~1e-3. Zero padding is exact:
the norms of the padded matrix are ``A``'s, and every iterate keeps zero rows and columns past ``m``.

``_pinv_fwd`` writes ``Z_{n_iter}`` and, when ``SAVE`` (autograd will need them), the iterates ``Z_0 … Z_{n_iter−1}``
to ``ITERATES``: what :mod:`kernels.pinv.backward` keeps from forward to backward, ``n_iter`` tiles a problem (its
:func:`step_terms` recomputes ``AZ, inner, S`` from them, all steps at once). Each step's ``A, AZ, W → S, inner``
(and ``Z`` without ``SAVE``) are tiles of the program's ``WORK``. The shared pieces (:func:`square_offsets`,
:func:`load_square`, :func:`load_tile`, :func:`publish`, :func:`product`, :func:`step_terms`, :func:`norms`,
:func:`start_norm`) serve the backward kernels too. Layouts: ``A, Z`` ``(P, m, m)``, ``ITERATES``
``(P, n_iter, BLOCK, BLOCK)``, ``WORK`` ``(P, 5, BLOCK, BLOCK)``, contiguous; ``NORM`` one float32 (global init).
Offsets are int64 (``P · n_iter · BLOCK²`` may pass 2³¹).
"""

from __future__ import annotations

import triton
import triton.language as tl

# torch.finfo(torch.float32).tiny: the clamp of the norm product (kernels.pinv.ops.start_norm)
TINY = tl.constexpr(1.1754943508222875e-38)
PRECISION = tl.constexpr("tf32x3")  # every product's dots (module doc); lra.bench's time model reads it
K_CHUNK = tl.constexpr(16)  # the K extent of one dot in a product (tl.dot's least)
WORK_TILES = tl.constexpr(5)  # a problem's WORK: A, AZ, W then S, inner, and Z without SAVE


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
def load_tile(ptr, BLOCK: tl.constexpr, TRANSPOSED: tl.constexpr):
    """A ``BLOCK × BLOCK`` row-major tile that :func:`publish` wrote, or its transpose."""
    offs = tl.arange(0, BLOCK)
    if TRANSPOSED:
        tile = tl.load(ptr + offs[None, :] * BLOCK + offs[:, None])
    else:
        tile = tl.load(ptr + offs[:, None] * BLOCK + offs[None, :])
    return tile


@triton.jit
def publish(ptr, tile, BLOCK: tl.constexpr):
    """Store the ``BLOCK × BLOCK`` ``tile`` where the program's next products read it (row-major, zero padding
    included): a barrier before (every thread's reads of what it overwrites are done) and after (every thread's
    share is visible to the others, CTA scope)."""
    offs = tl.arange(0, BLOCK)
    tl.debug_barrier()
    tl.store(ptr + offs[:, None] * BLOCK + offs[None, :], tile)
    tl.debug_barrier()


@triton.jit
def _chunk(X, X_T: tl.constexpr, Y, Y_T: tl.constexpr, start, BLOCK: tl.constexpr):
    """Columns ``start … start + K_CHUNK`` of ``op(X)`` and the same rows of ``op(Y)`` (:func:`product`)."""
    rows = tl.arange(0, BLOCK)
    ks = start + tl.arange(0, K_CHUNK)
    if X_T:  # op(X)[i, k] = X[k, i]
        x = tl.load(X + ks[None, :] * BLOCK + rows[:, None])
    else:
        x = tl.load(X + rows[:, None] * BLOCK + ks[None, :])
    if Y_T:  # op(Y)[k, j] = Y[j, k]
        y = tl.load(Y + rows[None, :] * BLOCK + ks[:, None])
    else:
        y = tl.load(Y + ks[:, None] * BLOCK + rows[None, :])
    return x, y


@triton.jit
def product(X, X_T: tl.constexpr, Y, Y_T: tl.constexpr, acc, BLOCK: tl.constexpr):
    """``acc + op(X) op(Y)`` of two ``BLOCK × BLOCK`` row-major tiles in global memory (:func:`publish`; ``op``
    transposes where ``X_T`` / ``Y_T``), ``acc`` float32: ``K_CHUNK`` columns of ``op(X)`` and rows of ``op(Y)``
    at a time, in :data:`PRECISION` dots. The loop is not unrolled: unrolled, the compiler hoists every product's
    loads and spills (docs/bench.md)."""
    for start in tl.range(0, BLOCK, K_CHUNK, loop_unroll_factor=1):
        x, y = _chunk(X, X_T, Y, Y_T, start, BLOCK)
        acc = tl.dot(x, y, acc, input_precision=PRECISION)
    return acc


@triton.jit
def tf32_part(x, SMALL: tl.constexpr):
    """``x``'s TF32 high part (rounded to nearest, ties away from zero, as ``cvt.rna.tf32.f32``: 13 low bits
    cleared), or with ``SMALL`` the float32 rest ``x − high`` (exact)."""
    high = ((x.to(tl.int32, bitcast=True) + 0x1000) & -0x2000).to(tl.float32, bitcast=True)
    if SMALL:
        high = x - high
    return high


@triton.jit
def _tf32_pass(X, X_T: tl.constexpr, Y, Y_T: tl.constexpr, acc, BLOCK: tl.constexpr, X_SMALL: tl.constexpr,
               Y_SMALL: tl.constexpr):
    for start in tl.range(0, BLOCK, K_CHUNK, loop_unroll_factor=1):
        x, y = _chunk(X, X_T, Y, Y_T, start, BLOCK)
        acc = tl.dot(tf32_part(x, X_SMALL), tf32_part(y, Y_SMALL), acc, input_precision="tf32")
    return acc


@triton.jit
def product_in_passes(X, X_T: tl.constexpr, Y, Y_T: tl.constexpr, acc, BLOCK: tl.constexpr):
    """:func:`product` as three passes over K, one TF32 dot each: ``small·big``, ``big·small``, ``big·big`` of
    the operands' :func:`tf32_part`, the terms and order of Triton's 3xTF32. Each pass re-reads its operands
    (just read by the pass before: L1/L2); a thread holds one pair of parts at a time, not four, which is what lets
    the serial backward run 16 warps without spills (registers of both forms: docs/bench.md). Any other
    :data:`PRECISION` is :func:`product`."""
    if PRECISION == "tf32x3":
        acc = _tf32_pass(X, X_T, Y, Y_T, acc, BLOCK, True, False)
        acc = _tf32_pass(X, X_T, Y, Y_T, acc, BLOCK, False, True)
        acc = _tf32_pass(X, X_T, Y, Y_T, acc, BLOCK, False, False)
    else:
        acc = product(X, X_T, Y, Y_T, acc, BLOCK)
    return acc


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
def step_terms(a, z, az, s, inner, eye, BLOCK: tl.constexpr):
    """One step's terms from the tiles ``A`` at ``a`` and ``Z`` at ``z``: ``AZ = A Z`` to ``az``, ``W = 7I − AZ`` to
    ``s``, ``inner = 15I − AZ W`` to ``inner``, then ``S = 3.25I − ¼ AZ inner`` over ``W`` at ``s``. The forward and
    the backward's recomputation run this same code, so they form the same numbers."""
    zero = tl.zeros([BLOCK, BLOCK], tl.float32)
    product_az = product(a, False, z, False, zero, BLOCK)
    publish(az, product_az, BLOCK)
    publish(s, tl.where(eye, 7.0 - product_az, -product_az), BLOCK)
    publish(inner, tl.where(eye, 15.0, 0.0) - product(az, False, s, False, zero, BLOCK), BLOCK)
    publish(s, tl.where(eye, 3.25, 0.0) - 0.25 * product(az, False, inner, False, zero, BLOCK), BLOCK)


@triton.jit
def _pinv_fwd(A, NORM, Z, ITERATES, WORK, M, N_ITER, BLOCK: tl.constexpr, HAS_NORM: tl.constexpr,
              SAVE: tl.constexpr):
    """One program: problem ``program_id(0)``, init and all ``N_ITER`` steps."""
    pid = tl.program_id(0).to(tl.int64)
    square, inside, eye = square_offsets(M, BLOCK)
    tile = BLOCK * BLOCK
    a_tile = load_square(A + pid * M * M, square, inside)
    a = WORK + pid * WORK_TILES * tile  # then AZ, W → S, inner, and Z without SAVE
    az, s, inner = a + tile, a + 2 * tile, a + 3 * tile
    publish(a, a_tile, BLOCK)
    z_tile = tl.trans(a_tile) / start_norm(a_tile, NORM, HAS_NORM)
    for k in range(N_ITER):
        if SAVE:
            z = ITERATES + (pid * N_ITER + k) * tile
        else:
            z = a + 4 * tile
        publish(z, z_tile, BLOCK)
        step_terms(a, z, az, s, inner, eye, BLOCK)
        z_tile = product(z, False, s, False, tl.zeros([BLOCK, BLOCK], tl.float32), BLOCK)  # Z ← Z S
    tl.store(Z + pid * M * M + square, z_tile, mask=inside)
