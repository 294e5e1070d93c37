"""Backward kernels of the fused pseudo-inverse: ``∂L/∂A`` through all ``n_iter`` steps and ``Z₀``'s scale.

Notation of :mod:`kernels.pinv.forward`, which keeps the iterates ``Z_0 … Z_{n_iter−1}`` (``ITERATES``). From
``G = ∂L/∂Z_{n_iter}``, for ``k = n_iter − 1 … 0``, the chain rule of :class:`kernels.pinv.ops.Iterations`::

    ∂S = Zᵀ G                       ∂inner = −¼ (AZ)ᵀ ∂S
    ∂(AZ) = −¼ ∂S innerᵀ − ∂inner Wᵀ + (AZ)ᵀ ∂inner       (W = 7I − AZ: −∂inner Wᵀ = −7 ∂inner + ∂inner (AZ)ᵀ)
    ∂A += ∂(AZ) Zᵀ                   G ← G Sᵀ + Aᵀ ∂(AZ)                 (then G = ∂L/∂Z₀)

Three kernels; every product reads its operands from tiles in global memory as the forward's
(:func:`kernels.pinv.forward.product`, :func:`~kernels.pinv.forward.publish`):

* ``_pinv_bwd_terms``, one program per problem and step (all steps at once: each needs only its ``Z_k``):
  ``A`` and ``AZ_k, inner_k, S_k`` by the forward's own code (:func:`kernels.pinv.forward.step_terms`, so the
  same numbers) into ``TERMS`` ``(P, n_iter, 4, BLOCK, BLOCK)``: three products a step, off the serial path, in a
  scratch that lives only through this backward (the forward keeps the iterates alone: ``n_iter`` tiles a problem
  across every layer's forward and backward, where keeping the terms too took four times that).
* ``_pinv_bwd_steps``, one program per problem, walks the steps, serial in ``G``: seven products a step, each in
  three TF32 passes (:func:`kernels.pinv.forward.product_in_passes`: the registers for 16 warps on sm_90), ``G``,
  ``∂S``, ``∂inner`` and ``G Sᵀ`` written to the problem's ``WORK`` ``(4, BLOCK, BLOCK)`` for the products that read
  them (one accumulator is live at a time), ``∂(AZ)_k`` over ``inner_k`` in ``TERMS``; ``G₀`` is left in ``WORK``'s
  first place.
* ``_pinv_bwd_grad``, one program per problem, sums ``∂A = Σ_k ∂(AZ)_k Z_kᵀ`` (one product a step) and adds
  ``Z₀ = Aᵀ / norm``'s terms: ``∂A += G₀ᵀ / norm`` and ``∂norm = −Σ G₀ ⊙ Z₀ / norm``. With a global norm (passed
  in) ``∂norm`` is written per problem and PyTorch sums it and differentiates the norm. Per problem (``norm =
  max(c·r, tiny)``, ``c = max_j Σ_i |a_ij|``, ``r = max_i Σ_j |a_ij|``) it finishes as autograd does through the
  PyTorch form (``kernels/pinv/ops.py``): ``clamp_min`` passes the gradient where ``c·r ≥ tiny``, ``amax`` splits it
  evenly among tied maxima, ``|a|`` multiplies by ``sign(a)`` (0 at 0)::

    ∂A_ij += sign(a_ij) · (∂norm · r · [c_j = c] / #{c_j = c}  +  ∂norm · c · [r_i = r] / #{r_i = r})

  (the norm is not detached).

Eleven products a step in all, O(n_iter · m³) per problem, in the forward's 3xTF32 dots
(:data:`kernels.pinv.forward.PRECISION`). Layouts as the forward; ``DZ, DA`` ``(P, m, m)``, ``WORK``
``(P, 4, BLOCK, BLOCK)`` contiguous, ``DNORM`` ``(P,)``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.pinv.forward import (TINY, load_square, load_tile, norms, product, publish, square_offsets, start_norm,
                                  step_terms)
from kernels.pinv.forward import product_in_passes as passes

TERMS_PER_STEP = tl.constexpr(4)  # A, AZ, S (W before it), inner (then ∂(AZ)) of one step
WORK_TILES = tl.constexpr(4)  # a problem's WORK: G (G₀ at the end), ∂S, ∂inner, G Sᵀ


@triton.jit
def _tied_share(sums, top):
    """``[sums_j = top] / #{sums_j = top}``: how ``amax`` hands its gradient to the maxima."""
    tied = (sums == top).to(tl.float32)
    return tied / tl.sum(tied, 0)


@triton.jit
def _pinv_bwd_terms(A, ITERATES, TERMS, M, N_ITER, BLOCK: tl.constexpr):
    """One program: ``A, AZ_k, S_k, inner_k`` of problem ``program_id(0)``, step ``program_id(1)``."""
    pid = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1)
    square, inside, eye = square_offsets(M, BLOCK)
    tile = BLOCK * BLOCK
    a = TERMS + (pid * N_ITER + k) * TERMS_PER_STEP * tile
    publish(a, load_square(A + pid * M * M, square, inside), BLOCK)
    step_terms(a, ITERATES + (pid * N_ITER + k) * tile, a + tile, a + 2 * tile, a + 3 * tile, eye, BLOCK)


@triton.jit
def _pinv_bwd_steps(ITERATES, TERMS, DZ, WORK, M, N_ITER, BLOCK: tl.constexpr):
    """One program: the serial chain of problem ``program_id(0)``, writing each ``∂(AZ)_k`` and ``G₀``."""
    pid = tl.program_id(0).to(tl.int64)
    square, inside, _ = square_offsets(M, BLOCK)
    tile = BLOCK * BLOCK
    a = TERMS + pid * N_ITER * TERMS_PER_STEP * tile  # A (step 0's copy)
    g = WORK + pid * WORK_TILES * tile  # G, then ∂S, ∂inner and G Sᵀ of the step
    grad_step, grad_inner, g_next = g + tile, g + 2 * tile, g + 3 * tile
    zero = tl.zeros([BLOCK, BLOCK], tl.float32)
    publish(g, load_square(DZ + pid * M * M, square, inside), BLOCK)
    for i in range(N_ITER):
        k = N_ITER - 1 - i
        z = ITERATES + (pid * N_ITER + k) * tile
        az = a + k * TERMS_PER_STEP * tile + tile
        step_matrix, inner = az + tile, az + 2 * tile
        publish(grad_step, passes(z, True, g, False, zero, BLOCK), BLOCK)  # ∂S = Zᵀ G
        publish(g_next, passes(g, False, step_matrix, True, zero, BLOCK), BLOCK)  # G Sᵀ
        publish(grad_inner, -0.25 * passes(az, True, grad_step, False, zero, BLOCK), BLOCK)  # −¼ (AZ)ᵀ ∂S
        # ∂(AZ) = −¼ ∂S innerᵀ − 7 ∂inner + ∂inner (AZ)ᵀ + (AZ)ᵀ ∂inner
        grad_az = passes(grad_step, False, inner, True, zero, BLOCK)
        grad_az = -0.25 * grad_az - 7.0 * load_tile(grad_inner, BLOCK, False)
        grad_az = passes(grad_inner, False, az, True, grad_az, BLOCK)
        grad_az = passes(az, True, grad_inner, False, grad_az, BLOCK)
        publish(inner, grad_az, BLOCK)  # ∂(AZ)_k in inner_k's place, read by _pinv_bwd_grad
        g_sum = passes(a, True, inner, False, load_tile(g_next, BLOCK, False), BLOCK)  # G Sᵀ + Aᵀ ∂(AZ)
        publish(g, g_sum, BLOCK)


@triton.jit
def _pinv_bwd_grad(A, NORM, ITERATES, TERMS, WORK, DA, DNORM, M, N_ITER, BLOCK: tl.constexpr,
                   HAS_NORM: tl.constexpr):
    """One program: ``∂L/∂A`` of problem ``program_id(0)`` (and its ``∂L/∂norm`` with a global norm)."""
    pid = tl.program_id(0).to(tl.int64)
    square, inside, _ = square_offsets(M, BLOCK)
    tile = BLOCK * BLOCK
    grad_a = tl.zeros([BLOCK, BLOCK], tl.float32)
    for k in range(N_ITER):  # + ∂(AZ)_k Z_kᵀ
        grad_az = TERMS + ((pid * N_ITER + k) * TERMS_PER_STEP + 3) * tile
        grad_a = product(grad_az, False, ITERATES + (pid * N_ITER + k) * tile, True, grad_a, BLOCK)
    a = load_square(A + pid * M * M, square, inside)
    g_t = load_tile(WORK + pid * WORK_TILES * tile, BLOCK, True)  # G₀ᵀ
    norm = start_norm(a, NORM, HAS_NORM)
    grad_a += g_t / norm
    grad_norm = -tl.sum(tl.sum(g_t * a, 1), 0) / (norm * norm)
    if HAS_NORM:
        tl.store(DNORM + pid, grad_norm)
    else:
        col_sums, row_sums, col, row = norms(a)
        grad_norm = tl.where(col * row >= TINY, grad_norm, 0.0)
        grad_col = grad_norm * row * _tied_share(col_sums, col)
        grad_row = grad_norm * col * _tied_share(row_sums, row)
        sign = tl.where(a > 0, 1.0, tl.where(a < 0, -1.0, 0.0))
        grad_a += sign * (grad_col[None, :] + grad_row[:, None])
    tl.store(DA + pid * M * M + square, grad_a, mask=inside)
