"""Backward kernel of the fused pseudo-inverse: ``∂L/∂A`` through all ``n_iter`` steps and ``Z₀``'s scale.

Notation of :mod:`kernels.pinv.forward`. From ``G = ∂L/∂Z_{n_iter}``, for ``k = n_iter − 1 … 0``, with
``Z = Z_k`` (read from the forward's saved iterates, ``Z₀`` recomputed from ``A``) and ``AZ, W, inner, S``
recomputed (three products), the chain rule of :class:`kernels.pinv.ops.Iterations`::

    ∂S = Zᵀ G                       ∂inner = −¼ (AZ)ᵀ ∂S
    ∂(AZ) = −¼ ∂S innerᵀ − ∂inner Wᵀ + (AZ)ᵀ ∂inner
    ∂A += ∂(AZ) Zᵀ                   G ← G Sᵀ + Aᵀ ∂(AZ)                 (then G = ∂L/∂Z₀)

Then ``Z₀ = Aᵀ / norm``: ``∂A += Gᵀ / norm`` and ``∂norm = −Σ G ⊙ Z₀ / norm``. With a global norm (passed
in) ``∂norm`` is written per problem and PyTorch sums it and differentiates the norm. Per problem
(``norm = max(c·r, tiny)``, ``c = max_j Σ_i |a_ij|``, ``r = max_i Σ_j |a_ij|``) the kernel finishes as
autograd does through the PyTorch form (``kernels/pinv/ops.py``): ``clamp_min`` passes the gradient where
``c·r ≥ tiny``, ``amax`` splits it evenly among tied maxima, ``|a|`` multiplies by ``sign(a)`` (0 at 0)::

    ∂A_ij += sign(a_ij) · (∂norm · r · [c_j = c] / #{c_j = c}  +  ∂norm · c · [r_i = r] / #{r_i = r})

(the norm is not detached). Eleven IEEE float32 products per step (three recomputing, eight of the chain rule),
O(n_iter · m³) per problem; one program per problem. Layouts as the forward; ``DZ, DA`` ``(P, m, m)``
contiguous, ``DNORM`` ``(P,)``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.pinv.forward import TINY, inner_term, load_square, mm, norms, square_offsets, start_norm, step_term

PRECISION = tl.constexpr("ieee")  # the backward's products: 3xTF32 would spill its seven live tiles (module doc)


@triton.jit
def _tied_share(sums, top):
    """``[sums_j = top] / #{sums_j = top}``: how ``amax`` hands its gradient to the maxima."""
    tied = (sums == top).to(tl.float32)
    return tied / tl.sum(tied, 0)


@triton.jit
def _pinv_bwd(A, NORM, SAVED, DZ, DA, DNORM, M, N_ITER, BLOCK: tl.constexpr, HAS_NORM: tl.constexpr):
    """One program: ``∂L/∂A`` of problem ``program_id(0)`` (and its ``∂L/∂norm`` with a global norm)."""
    pid = tl.program_id(0).to(tl.int64)
    square, inside, eye = square_offsets(M, BLOCK)
    size = M * M
    a = load_square(A + pid * size, square, inside)
    norm = start_norm(a, NORM, HAS_NORM)
    g = load_square(DZ + pid * size, square, inside)
    grad_a = tl.zeros([BLOCK, BLOCK], tl.float32)
    saved = SAVED + pid * (N_ITER - 1) * size
    for i in range(N_ITER):
        k = N_ITER - 1 - i
        if k > 0:
            z = load_square(saved + (k - 1) * size, square, inside)
        else:
            z = tl.trans(a) / norm
        # The chain rule above, ordered so that at most seven m × m tiles are live (W = 7I − AZ is never kept:
        # −∂inner Wᵀ = −7 ∂inner + ∂inner (AZ)ᵀ).
        az = mm(a, z, PRECISION)
        inner = inner_term(az, eye, PRECISION)
        grad_step = mm(tl.trans(z), g, PRECISION)
        g = mm(g, tl.trans(step_term(az, inner, eye, PRECISION)), PRECISION)
        grad_az = -0.25 * mm(grad_step, tl.trans(inner), PRECISION)
        grad_inner = -0.25 * mm(tl.trans(az), grad_step, PRECISION)
        grad_az += mm(grad_inner, tl.trans(az), PRECISION) + mm(tl.trans(az), grad_inner, PRECISION) - 7.0 * grad_inner
        grad_a += mm(grad_az, tl.trans(z), PRECISION)
        g += mm(tl.trans(a), grad_az, PRECISION)
    grad_a += tl.trans(g) / norm
    grad_norm = -tl.sum(tl.sum(g * tl.trans(a), 1), 0) / (norm * norm)
    if HAS_NORM:
        tl.store(DNORM + pid, grad_norm)
    else:
        col_sums, row_sums, col, row = norms(a)
        grad_norm = tl.where(col * row >= TINY, grad_norm, 0.0)
        grad_col = grad_norm * row * _tied_share(col_sums, col)
        grad_row = grad_norm * col * _tied_share(row_sums, row)
        sign = tl.where(a > 0, 1.0, tl.where(a < 0, -1.0, 0.0))
        grad_a += sign * (grad_col[None, :] + grad_row[:, None])
    tl.store(DA + pid * size + square, grad_a, mask=inside)
