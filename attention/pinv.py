"""Iterative Moore–Penrose pseudo-inverse (Nyströmformer, Xiong et al. 2021, eq. 16; docs/design.md §2 "Pseudo-inverse").

``Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞)`` (max absolute column sum × max absolute row sum),
then ``Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ)))`` ``n_iter`` times. The iteration is a polynomial in
``A Z``, so it keeps the block structure of ``A`` (CUR and Nyström put an identity block on invalid
landmarks; see :mod:`attention.cur`) and stays finite on rank-deficient matrices (``Z₀`` lies in
the row space of ``Aᵀ`` and the iteration only multiplies by ``A``/``Z``).

Scale of ``Z₀`` (``init``, the config key ``attention.pinv_init``):

* ``per_head`` (default, the paper's eq. 16): the two norms of each ``m × m`` matrix, i.e. per batch
  row and head.
* ``global``: one maximum of the column sums and one of the row sums over *all* matrices of the call
  (batch, heads, MEGA chunks), ``Z₀ = Aᵀ / (max_{b,h} ‖A_bh‖₁ · max_{b,h} ‖A_bh‖∞)``, as the public
  code does (mlpen/Nystromformer ``LRA/code/attention_nystrom.py``, its default ``"original"`` init,
  and HF transformers' Nystromformer, divide by the maximum column sum over the whole tensor; their
  matrix is a softmax, whose row sums are all 1, so this is their ``Z₀``). Use it to match their
  numbers. A sequence's result then depends on the other sequences of its batch, and a head whose
  ``‖A‖₁`` is far below the batch maximum starts further from ``A⁺`` (slower convergence).

Both inits give the same ``Z₀`` for a single matrix (batch = heads = 1), and the same limit.

Precision: the iteration diverges in fp16/bf16, so it always runs in float32 with autocast
disabled (float64 inputs stay float64, for gradcheck); the result has the compute dtype.
Cost: O(n_iter · m³) for ``m × m`` matrices.

Where it runs (a dispatch on device, dtype and shape, :func:`fused_takes`): float32 matrices on CUDA
with ``m ≤ 64`` run the fused Triton kernels of :mod:`kernels.pinv`, one launch forward (the init and all
``n_iter`` steps, one program per matrix) and one backward, as the custom op ``lra_pinv::forward`` (also on
``meta``, where its fake implementation gives the shapes); with ``global`` the shared norm is computed here
and passed in. Everything else runs the PyTorch form (:func:`pytorch_pinv`): float64 (gradcheck), ``m > 64``
(a matrix no longer fits one program's registers: :mod:`kernels.pinv.launch`), and CPU tensors, where the
C++ kernel of :mod:`kernels.cpu.pinv` takes float32 and eager calls it serves. Both forms compute the same
iterates and the same gradient (through the norms too), to float32 rounding.
"""

from __future__ import annotations

import torch

from kernels.cpu import pinv as pinv_kernel
from attention.precision import autocast_off
from kernels.pinv import launch as fused_launch
from kernels.pinv.ops import fused_pinv

PINV_INITS = ("per_head", "global")


def check_pinv_init(init: str) -> str:
    """``init`` if it is one of :data:`PINV_INITS`, else a config error naming ``attention.pinv_init``."""
    if init not in PINV_INITS:
        raise ValueError(
            f"attention.pinv_init must be one of {list(PINV_INITS)} (per_head: the paper's Z₀ per batch row and "
            f"head; global: one maximum over the batch, as mlpen/Nystromformer and HF), got {init!r}"
        )
    return init


def iterative_pinv(matrix: torch.Tensor, n_iter: int = 6, init: str = "per_head") -> torch.Tensor:
    """Approximate pseudo-inverse of ``matrix`` ``(..., m, m)`` after ``n_iter`` iterations -> ``(..., m, m)``.

    ``init``: ``per_head`` scales ``Z₀`` by each matrix's own norms, ``global`` by the maxima over all
    leading dimensions (see the module doc). The fused kernels where :func:`fused_takes`, else
    :func:`pytorch_pinv`.
    """
    check_arguments(matrix, n_iter, init)
    with autocast_off(matrix.device.type):
        a = matrix.float() if matrix.dtype != torch.float64 else matrix
        if fused_takes(a):
            m = a.shape[-1]
            norm = start_norm(a, init) if init == "global" else None  # per_head: the kernel takes each matrix's norms
            return fused_pinv(a.reshape(-1, m, m), n_iter, norm).reshape(a.shape)
    return pytorch_pinv(a, n_iter, init)


def check_arguments(matrix: torch.Tensor, n_iter: int, init: str) -> None:
    if n_iter < 1:
        raise ValueError(f"pinv_iters must be >= 1, got {n_iter}")
    if matrix.shape[-1] != matrix.shape[-2]:
        raise ValueError(f"iterative_pinv expects square (..., m, m) matrices, got shape {tuple(matrix.shape)}")
    check_pinv_init(init)


def pytorch_pinv(matrix: torch.Tensor, n_iter: int = 6, init: str = "per_head") -> torch.Tensor:
    """:func:`iterative_pinv` in its PyTorch form on any device: ``bmm``/``baddbmm`` per step, one autograd node
    (:class:`_Iterations`), the CPU kernel of :mod:`kernels.cpu.pinv` where it takes the operands."""
    check_arguments(matrix, n_iter, init)
    dtype = torch.float64 if matrix.dtype == torch.float64 else torch.float32
    with autocast_off(matrix.device.type):
        a = matrix.to(dtype)
        shape, m = a.shape, a.shape[-1]
        norm = start_norm(a, init)
        a = a.reshape(-1, m, m)  # one batch dimension for bmm/baddbmm
        z = a.transpose(-1, -2) / norm.reshape(-1, 1, 1)
        if torch.is_grad_enabled() and z.requires_grad:  # z carries a's requires_grad
            z = _Iterations.apply(a, z, n_iter)
        elif pinv_kernel.takes(a):
            z = pinv_kernel.iterate(a, z, n_iter, keep=False)[0]
        else:
            z = _iterate(a, z, n_iter)
    return z.reshape(shape)


def fused_takes(a: torch.Tensor) -> bool:
    """Whether :func:`iterative_pinv` runs the fused Triton kernels (:mod:`kernels.pinv`) on ``a`` ``(..., m, m)``:
    float32 on a CUDA device, or on ``meta`` (shapes only: the custom ops' fake implementations, so a trace on
    ``meta`` sees the CUDA path), with ``m ≤ 64`` (one problem per program, held in registers)."""
    return a.dtype == torch.float32 and a.device.type in ("cuda", "meta") and fused_launch.takes(a.shape[-1])


def start_norm(a: torch.Tensor, init: str) -> torch.Tensor:
    """The scale of ``Z₀ = Aᵀ / norm``: ``max(‖A‖₁ ‖A‖∞, tiny)`` per matrix ``(..., 1, 1)``, or with ``global``
    one value ``(1, 1)`` from the maxima over all matrices. Differentiable (the norm is not detached)."""
    absolute = a.abs()
    col_sum = absolute.sum(-2).amax(-1)  # ‖A‖₁, (...)
    row_sum = absolute.sum(-1).amax(-1)  # ‖A‖∞, (...)
    if init == "global":
        col_sum, row_sum = col_sum.amax(), row_sum.amax()  # one maximum over batch and heads, ()
    return (col_sum * row_sum).clamp_min(torch.finfo(a.dtype).tiny)[..., None, None]


def _iterate(a: torch.Tensor, z: torch.Tensor, n_iter: int, saved: list | None = None) -> torch.Tensor:
    """``n_iter`` steps ``Z ← Z S``, ``S = ¼ (13I − AZ(15I − AZ(7I − AZ)))``, on ``(P, m, m)`` matrices; with
    ``saved``, each step's ``(Z, AZ, W = 7I − AZ, inner = 15I − AZ W, S)`` is appended for the backward."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    eye_7, eye_15, eye_13_4 = 7 * eye, 15 * eye, 3.25 * eye
    for _ in range(n_iter):
        az = torch.bmm(a, z)
        w = eye_7 - az
        inner = torch.baddbmm(eye_15, az, w, alpha=-1)  # 15I − AZ(7I − AZ)
        step = torch.baddbmm(eye_13_4, az, inner, alpha=-0.25)  # (13I − AZ·inner) / 4
        if saved is not None:
            saved.append((z, az, w, inner, step))
        z = torch.bmm(z, step)
    return z


class _Iterations(torch.autograd.Function):
    """:func:`_iterate` as one autograd node: the same forward, and a backward that is exactly the chain rule through
    every step, written as eight GEMMs per step with the constants folded into their ``alpha`` (``baddbmm``), where
    autograd adds a scaling, a negation and an accumulation pass per product. Per step, from ``G = ∂L/∂Z'``:
    ``∂S = Zᵀ G``, ``∂Z = G Sᵀ``, ``∂inner = −¼ (AZ)ᵀ ∂S``, ``∂(AZ) = −¼ ∂S innerᵀ − ∂inner Wᵀ + (AZ)ᵀ ∂inner``,
    then ``∂A += ∂(AZ) Zᵀ`` and ``∂Z += Aᵀ ∂(AZ)``. Used when autograd records the call (:func:`iterative_pinv`);
    forward and backward run the CPU kernel of :mod:`kernels.cpu.pinv` where it takes the operands."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, z: torch.Tensor, n_iter: int) -> torch.Tensor:
        ctx.kernel = pinv_kernel.takes(a)
        if ctx.kernel:
            out, saved = pinv_kernel.iterate(a, z, n_iter, keep=True)
            ctx.save_for_backward(a, saved)
            return out
        steps: list = []
        out = _iterate(a, z, n_iter, steps)
        ctx.save_for_backward(a, *(t for step in steps for t in step))
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        a, *flat = ctx.saved_tensors
        if ctx.kernel:
            return *pinv_kernel.iterate_backward(a, flat[0], grad), None
        grad_a, grad_z = torch.zeros_like(a), grad  # grad_z is a fresh product after the first step
        for index in range(len(flat) // 5 - 1, -1, -1):
            z, az, w, inner, step = flat[5 * index: 5 * index + 5]
            grad_step = torch.bmm(z.mT, grad_z)
            grad_z = torch.bmm(grad_z, step.mT)
            # beta = 0: the first argument only gives the shape, alpha the product's scale
            grad_inner = torch.baddbmm(inner, az.mT, grad_step, beta=0, alpha=-0.25)
            grad_az = torch.baddbmm(inner, grad_step, inner.mT, beta=0, alpha=-0.25)
            grad_az.baddbmm_(grad_inner, w.mT, alpha=-1).baddbmm_(az.mT, grad_inner)
            grad_a.baddbmm_(grad_az, z.mT)
            grad_z.baddbmm_(a.mT, grad_az)
        return grad_a, grad_z, None
