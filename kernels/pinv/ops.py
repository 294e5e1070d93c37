"""The iterative pseudo-inverse's ops: the fused Triton kernels as ``torch.library`` custom ops, the PyTorch form's
autograd (over the C++ CPU kernel of :mod:`kernels.pinv.cpu` in the ``cpu`` form), and :func:`pinv`, which runs
the form it is given (the choice: :mod:`attention.impl`). The method, its inits and its checks: :mod:`attention.pinv`;
the plain reference every form is tested against: :mod:`kernels.pinv.naive`.

:func:`pinv` runs ``a`` ``(..., m, m)`` (float32 or float64, autocast off, arguments checked by the caller) in the
form it is given:

* ``"triton"``: float32 on CUDA (or ``meta``, the fake implementations) with ``m ≤ 64``: the custom ops below, one
  launch forward, one backward.
* ``"cpu"``: float32 CPU tensors the C++ kernel takes (:func:`kernels.pinv.cpu.takes`): its steps, and with autograd
  :class:`Iterations` over its forward and backward.
* ``"pytorch"``: everything else (float64, ``m > 64`` on CUDA, CPU sizes the kernel does not take): :func:`steps`,
  with autograd :class:`Iterations`.

With ``recompute`` the non-fused forms keep only ``a`` for the backward (:class:`_RecomputedPinv`, FlashCUR).

The custom ops:

* ``lra_pinv::forward(a, norm, n_iter, save) -> (Z, iterates)`` runs ``_pinv_fwd`` of :mod:`kernels.pinv.forward`
  on ``a`` ``(P, m, m)`` float32: ``Z`` ``(P, m, m)`` after ``n_iter`` steps, and with ``save`` the iterates
  ``Z_0 … Z_{n_iter−1}`` zero-padded to ``BLOCK × BLOCK`` ``(P, n_iter, BLOCK, BLOCK)`` for the backward (else an
  empty tensor). ``norm``: None for the per-problem scale of ``Z₀`` (``‖A‖₁ ‖A‖∞``, computed in the kernel), or a
  one-element float32 tensor, the global scale every problem shares.
* ``lra_pinv::backward(a, norm, iterates, grad_z, n_iter) -> (∂A, ∂norm)`` runs ``_pinv_bwd_terms``,
  ``_pinv_bwd_steps`` and ``_pinv_bwd_grad`` of :mod:`kernels.pinv.backward`; ``∂norm`` is per problem ``(P,)`` with
  a global norm (summed here), else empty.

Both have fake implementations (shapes and dtypes: the ``meta`` device, ``torch.compile``'s tracing, where
each stays one node), and the backward is registered as the forward's autograd formula (no double backward).
Memory kept for the backward: ``n_iter · BLOCK²`` floats per problem (the iterates; autograd through the PyTorch
form keeps five ``m × m`` matrices per step); the backward recomputes each step's ``AZ, inner, S`` from them, all
steps at once and off its serial chain (three of its eleven products per step), rather than keeping four matrices
per step through every layer's forward and backward.
:func:`fused_pinv` is their checked entry point (benchmarks, tests); :func:`pinv` calls them unchecked.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
from torch.utils.flop_counter import register_flop_formula

from kernels.common.launch import planning, runs_interpreted
from kernels.common.precision import autocast_off
from kernels.pinv import cpu as cpu_pinv
from kernels.pinv import launch

Tensor = torch.Tensor


def _check_device(a: Tensor) -> None:
    """The kernels run on CUDA tensors, on CPU tensors under the Triton interpreter, and on ``meta`` tensors while a
    launch plan records them (:func:`kernels.common.launch.recording`)."""
    if a.is_cuda or planning(a) or runs_interpreted(a.device):
        return
    hint = (
        "kernels.pinv was imported without TRITON_INTERPRET=1: set it in the environment before starting Python"
        if os.environ.get("TRITON_INTERPRET") == "1"
        else "call attention.pinv.iterative_pinv, which runs the PyTorch form on this device, or set "
        "TRITON_INTERPRET=1 before starting Python to run the kernels in Triton's (slow) CPU interpreter"
    )
    raise RuntimeError(
        f"the fused pseudo-inverse needs CUDA tensors or the Triton interpreter, got {a.device} tensors: {hint}"
    )


@torch.library.custom_op("lra_pinv::forward", mutates_args=())
def pinv_forward(a: Tensor, norm: Optional[Tensor], n_iter: int, save: bool) -> tuple[Tensor, Tensor]:
    """``Z_{n_iter}`` of every problem of ``a`` ``(P, m, m)`` and, with ``save``, the iterates ``Z_0 … Z_{n_iter−1}``
    the backward reads, zero-padded tiles ``(P, n_iter, BLOCK, BLOCK)`` (else an empty tensor)."""
    _check_device(a)
    problems, m, _ = a.shape
    z = torch.empty_like(a)
    iterates = a.new_empty(launch.tiles(problems, m, n_iter)) if save else a.new_empty(0)
    work = a.new_empty(launch.tiles(problems, m, launch.FORWARD_TILES))  # one step's A, AZ, S, inner, Z
    config = launch.launch_config("_pinv_fwd", m, norm is not None, save)
    # Pointers a launch never dereferences (HAS_NORM / SAVE false) get ``a``.
    launch.launch("_pinv_fwd", problems, config, a, a if norm is None else norm, z, iterates if save else a, work,
                  m, n_iter, n_iter=n_iter)
    return z, iterates


@pinv_forward.register_fake
def _(a, norm, n_iter, save):
    problems, m, _ = a.shape
    return torch.empty_like(a), a.new_empty(launch.tiles(problems, m, n_iter)) if save else a.new_empty(0)


@torch.library.custom_op("lra_pinv::backward", mutates_args=())
def pinv_backward(a: Tensor, norm: Optional[Tensor], iterates: Tensor, grad_z: Tensor,
                  n_iter: int) -> tuple[Tensor, Tensor]:
    """``∂L/∂A`` ``(P, m, m)`` from ``grad_z = ∂L/∂Z_{n_iter}``, and ``∂L/∂norm`` per problem ``(P,)`` with a
    global norm: ``_pinv_bwd_terms``, ``_pinv_bwd_steps``, ``_pinv_bwd_grad`` (:mod:`kernels.pinv.backward`), through
    scratch tiles of ``(4 n_iter + 4) · BLOCK²`` floats per problem that live only through this call."""
    _check_device(a)
    problems, m, _ = a.shape
    terms = a.new_empty(launch.tiles(problems, m, n_iter, launch.TERMS_TILES))  # each step's A, AZ, S, inner
    work = a.new_empty(launch.tiles(problems, m, launch.BACKWARD_TILES))  # G (G₀ at the end), ∂S, ∂inner, G Sᵀ
    config = launch.launch_config("_pinv_bwd_terms", m, False)
    launch.launch("_pinv_bwd_terms", problems, config, a, iterates, terms, m, n_iter, n_iter=n_iter)
    config = launch.launch_config("_pinv_bwd_steps", m, False)
    launch.launch("_pinv_bwd_steps", problems, config, iterates, terms, grad_z, work, m, n_iter, n_iter=n_iter)
    grad_a = torch.empty_like(a)
    grad_norm = a.new_empty(problems) if norm is not None else a.new_empty(0)
    launch.launch("_pinv_bwd_grad", problems, launch.launch_config("_pinv_bwd_grad", m, norm is not None),
                  a, a if norm is None else norm, iterates, terms, work, grad_a, grad_norm if norm is not None else a,
                  m, n_iter, n_iter=n_iter)
    return grad_a, grad_norm


@pinv_backward.register_fake
def _(a, norm, iterates, grad_z, n_iter):
    return torch.empty_like(a), a.new_empty(a.shape[0] if norm is not None else 0)


def _setup(ctx, inputs, output):
    a, norm, n_iter, save = inputs
    ctx.save_for_backward(a, norm, output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # no zero-filled gradient of the iterates (a memset launch of their size)
    ctx.n_iter, ctx.saved_iterates = n_iter, save


def _grad(ctx, grad_z, _grad_iterates):
    if not ctx.saved_iterates:
        raise RuntimeError("lra_pinv::forward ran with save=False, so it kept nothing to differentiate: call "
                           "fused_pinv, which saves the iterates whenever autograd records the call")
    a, norm, iterates = ctx.saved_tensors
    grad_a, grad_norm = pinv_backward(a, norm, iterates, grad_z.contiguous(), ctx.n_iter)
    return grad_a, None if norm is None else grad_norm.sum().reshape(norm.shape), None, None


pinv_forward.register_autograd(_grad, setup_context=_setup)

# FLOP formulas for torch.utils.flop_counter (it does not see inside the Triton kernels), 2·m³ per m × m product:
# a forward step runs four (AZ, AZ·W, AZ·inner, Z·S), a backward step eleven (three recomputing AZ, inner, S, eight of
# the chain rule; kernels.pinv.backward).
FORWARD_PRODUCTS, BACKWARD_PRODUCTS = 4, 11


@register_flop_formula(torch.ops.lra_pinv.forward)
def _(a, norm, n_iter, save, *args, out_shape=None, **kwargs) -> int:
    problems, m, _ = a
    return FORWARD_PRODUCTS * n_iter * problems * 2 * m**3


@register_flop_formula(torch.ops.lra_pinv.backward)
def _(a, norm, iterates, grad_z, n_iter, *args, out_shape=None, **kwargs) -> int:
    problems, m, _ = a
    return BACKWARD_PRODUCTS * n_iter * problems * 2 * m**3


def check_iterations(n_iter: int) -> None:
    """The pseudo-inverse's one check of its iteration count (``attention.pinv_iters``)."""
    if n_iter < 1:
        raise ValueError(f"pinv_iters must be >= 1, got {n_iter}")


def fused_pinv(a: Tensor, n_iter: int, norm: Tensor | None = None) -> Tensor:
    """``n_iter`` Newton–Schulz steps from ``Z₀ = Aᵀ / norm`` on ``a`` ``(P, m, m)`` float32 -> ``(P, m, m)``.

    ``norm``: None (per problem, ``max(‖A‖₁ ‖A‖∞, tiny)`` in the kernel) or a one-element float32 tensor
    (global, differentiable). ``1 ≤ m ≤ 64`` (:func:`kernels.pinv.launch.takes`). Differentiable in ``a``
    and ``norm``; the iterates are kept only when autograd records the call. O(n_iter · m³) per problem.
    The arguments are checked here (:func:`pinv` runs the same ops on what its caller already checked).
    """
    if a.dim() != 3 or a.shape[1] != a.shape[2] or not launch.takes(a.shape[1]):
        raise ValueError(
            f"fused_pinv expects (P, m, m) float32 matrices with 1 <= m <= {launch.MAX_M}, got {tuple(a.shape)}"
        )
    check_iterations(n_iter)
    launch.check_float32(a, *([] if norm is None else [norm]))
    if norm is not None and norm.numel() != 1:
        raise ValueError(f"fused_pinv takes one global norm (a one-element tensor), got shape {tuple(norm.shape)}")
    return _fused(a, n_iter, norm)


def _fused(a: Tensor, n_iter: int, norm: Tensor | None) -> Tensor:
    """:func:`fused_pinv` without its checks."""
    save = torch.is_grad_enabled() and (a.requires_grad or (norm is not None and norm.requires_grad))
    z, _ = pinv_forward(a.contiguous(), None if norm is None else norm.reshape(()), n_iter, save)
    return z


# ---- the forms: Triton, the C++ CPU kernel, PyTorch (which one: attention.impl's table, attention/impl.py) ---------

FORMS = ("triton", "cpu", "pytorch")


def pinv(a: Tensor, n_iter: int, init: str = "per_head", form: str = "pytorch", recompute: bool = False) -> Tensor:
    """Pseudo-inverse of ``a`` ``(..., m, m)`` after ``n_iter`` steps -> ``(..., m, m)`` in ``form`` (one of
    :data:`FORMS`, chosen by :mod:`attention.impl`): ``"triton"`` the custom ops above for float32 with ``m ≤ 64``
    (one problem per program, held in registers; other matrices the PyTorch form), ``"cpu"`` the C++ kernel where it
    takes ``a`` (:func:`kernels.pinv.cpu.takes`: float32, eager, ``m`` a power of two times the vector width, at most
    128; else the PyTorch form), ``"pytorch"`` :func:`steps`. ``a`` is float32 or float64 and autocast is off;
    ``n_iter`` and ``init`` (``per_head`` | ``global``) were checked by the caller
    (:func:`attention.pinv.iterative_pinv`). ``recompute``: the non-Triton forms keep only ``a`` for the backward
    (:class:`_RecomputedPinv`)."""
    m = a.shape[-1]
    flat = a.reshape(-1, m, m)  # one batch dimension for the kernels and bmm/baddbmm
    if form == "triton" and a.dtype == torch.float32 and launch.takes(m):
        norm = start_norm(a, init) if init == "global" else None  # per_head: the kernel takes each matrix's norms
        return _fused(flat, n_iter, norm).reshape(a.shape)
    cpu_kernel = form == "cpu" and cpu_pinv.takes(flat)
    if recompute:
        return _RecomputedPinv.apply(a, n_iter, init, cpu_kernel)
    return _pytorch(a, n_iter, init, cpu_kernel)


def start_norm(a: Tensor, init: str) -> Tensor:
    """The scale of ``Z₀ = Aᵀ / norm``: ``max(‖A‖₁ ‖A‖∞, tiny)`` per matrix ``(..., 1, 1)``, or with ``global``
    one value ``(1, 1)`` from the maxima over all matrices. Differentiable (the norm is not detached)."""
    absolute = a.abs()
    col_sum = absolute.sum(-2).amax(-1)  # ‖A‖₁, (...)
    row_sum = absolute.sum(-1).amax(-1)  # ‖A‖∞, (...)
    if init == "global":
        col_sum, row_sum = col_sum.amax(), row_sum.amax()  # one maximum over batch and heads, ()
    return (col_sum * row_sum).clamp_min(torch.finfo(a.dtype).tiny)[..., None, None]


def _pytorch(a: Tensor, n_iter: int, init: str, cpu_kernel: bool) -> Tensor:
    """The PyTorch form: ``Z₀`` from :func:`start_norm`, then the steps by the C++ kernel (``cpu_kernel``) or
    :func:`steps`, one autograd node (:class:`Iterations`) when autograd records ``a``."""
    shape, m = a.shape, a.shape[-1]
    norm = start_norm(a, init)
    a = a.reshape(-1, m, m)
    z = a.transpose(-1, -2) / norm.reshape(-1, 1, 1)
    if torch.is_grad_enabled() and z.requires_grad:  # z carries a's requires_grad
        z = Iterations.apply(a, z, n_iter, cpu_kernel)
    elif cpu_kernel:
        z = cpu_pinv.iterate(a, z, n_iter, keep=False)[0]
    else:
        z = steps(a, z, n_iter)
    return z.reshape(shape)


def steps(a: Tensor, z: Tensor, n_iter: int, saved: list | None = None) -> Tensor:
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


class Iterations(torch.autograd.Function):
    """:func:`steps` as one autograd node: the same forward, and a backward that is exactly the chain rule through
    every step, written as eight GEMMs per step with the constants folded into their ``alpha`` (``baddbmm``), where
    autograd adds a scaling, a negation and an accumulation pass per product. Per step, from ``G = ∂L/∂Z'``:
    ``∂S = Zᵀ G``, ``∂Z = G Sᵀ``, ``∂inner = −¼ (AZ)ᵀ ∂S``, ``∂(AZ) = −¼ ∂S innerᵀ − ∂inner Wᵀ + (AZ)ᵀ ∂inner``,
    then ``∂A += ∂(AZ) Zᵀ`` and ``∂Z += Aᵀ ∂(AZ)``. With ``cpu_kernel`` (the ``"cpu"`` form) forward and
    backward run the C++ kernel of :mod:`kernels.pinv.cpu` instead."""

    @staticmethod
    def forward(ctx, a: Tensor, z: Tensor, n_iter: int, cpu_kernel: bool) -> Tensor:
        ctx.kernel = cpu_kernel
        if cpu_kernel:
            out, saved = cpu_pinv.iterate(a, z, n_iter, keep=True)
            ctx.save_for_backward(a, saved)
            return out
        kept: list = []
        out = steps(a, z, n_iter, kept)
        ctx.save_for_backward(a, *(t for step in kept for t in step))
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        a, *flat = ctx.saved_tensors
        if ctx.kernel:
            return *cpu_pinv.iterate_backward(a, flat[0], grad), None, None
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
        return grad_a, grad_z, None, None


class _RecomputedPinv(torch.autograd.Function):
    """The PyTorch form (:func:`_pytorch`) saving only ``U``: the backward runs the iteration again and
    differentiates it, so its ``5 · n_iter`` matrices of ``m × m`` per head (at n = 4096, m = 64 half the size of an
    ``n × m`` one) are not kept from forward to backward (FlashCUR's budget). (``torch.utils.checkpoint`` does the
    same but makes a tensor on the host in each call, which a GPU step must not.)"""

    @staticmethod
    def forward(ctx, u: Tensor, n_iter: int, init: str, cpu_kernel: bool) -> Tensor:
        ctx.save_for_backward(u)
        ctx.n_iter, ctx.init, ctx.cpu_kernel = n_iter, init, cpu_kernel
        return _pytorch(u, n_iter, init, cpu_kernel)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (u,) = ctx.saved_tensors
        with torch.enable_grad():
            u = u.detach().requires_grad_()
            with autocast_off(u.device.type):
                z = _pytorch(u, ctx.n_iter, ctx.init, ctx.cpu_kernel)
            return torch.autograd.grad(z, u, grad)[0], None, None, None
