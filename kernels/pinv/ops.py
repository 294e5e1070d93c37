"""The fused pseudo-inverse as ``torch.library`` custom ops: one kernel launch forward, one backward.

* ``lra_pinv::forward(a, norm, n_iter, save) -> (Z, saved)`` runs ``_pinv_fwd`` of :mod:`kernels.pinv.forward`
  on ``a`` ``(P, m, m)`` float32: ``Z`` ``(P, m, m)`` after ``n_iter`` steps, and with ``save`` the step inputs
  ``Z_1 … Z_{n_iter−1}`` ``(P, n_iter − 1, m, m)`` for the backward (else an empty tensor). ``norm``: None for
  the per-problem scale of ``Z₀`` (``‖A‖₁ ‖A‖∞``, computed in the kernel), or a one-element float32 tensor,
  the global scale every problem shares.
* ``lra_pinv::backward(a, norm, saved, grad_z, n_iter) -> (∂A, ∂norm)`` runs ``_pinv_bwd`` of
  :mod:`kernels.pinv.backward`; ``∂norm`` is per problem ``(P,)`` with a global norm (summed here), else empty.

Both have fake implementations (shapes and dtypes: the ``meta`` device, ``torch.compile``'s tracing, where
each stays one node), and the backward is registered as the forward's autograd formula (no double backward).
Memory kept for the backward: ``(n_iter − 1) · m²`` floats per problem (the iterates), where autograd through
the PyTorch form keeps five ``m × m`` matrices per step; the backward recomputes ``AZ, W, inner, S`` from them
(three of its eleven products per step) rather than reading four more saved matrices per step.
:func:`fused_pinv` is the entry point (what :func:`attention.pinv.iterative_pinv` calls on CUDA).
"""

from __future__ import annotations

import os
from typing import Optional

import torch
from torch.utils.flop_counter import register_flop_formula

from kernels.common.launch import interpreted, planning
from kernels.pinv import launch

Tensor = torch.Tensor


def _check_device(a: Tensor) -> None:
    """The kernels run on CUDA tensors, on CPU tensors under the Triton interpreter, and on ``meta`` tensors while a
    launch plan records them (:func:`kernels.common.launch.recording`)."""
    if a.is_cuda or planning(a) or (a.device.type == "cpu" and interpreted()):
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
    """``Z_{n_iter}`` of every problem of ``a`` ``(P, m, m)`` and, with ``save``, the iterates the backward reads."""
    _check_device(a)
    problems, m, _ = a.shape
    z = torch.empty_like(a)
    saved = a.new_empty(problems, n_iter - 1, m, m) if save else a.new_empty(0)
    config = launch.launch_config("_pinv_fwd", m, norm is not None, save)
    # Pointers a launch never dereferences (HAS_NORM / SAVE false, or no iterate to save) get ``a``.
    launch.launch("_pinv_fwd", problems, config, a, a if norm is None else norm, z, saved if saved.numel() else a,
                  m, n_iter, n_iter=n_iter)
    return z, saved


@pinv_forward.register_fake
def _(a, norm, n_iter, save):
    problems, m, _ = a.shape
    return torch.empty_like(a), a.new_empty(problems, n_iter - 1, m, m) if save else a.new_empty(0)


@torch.library.custom_op("lra_pinv::backward", mutates_args=())
def pinv_backward(a: Tensor, norm: Optional[Tensor], saved: Tensor, grad_z: Tensor,
                  n_iter: int) -> tuple[Tensor, Tensor]:
    """``∂L/∂A`` ``(P, m, m)`` from ``grad_z = ∂L/∂Z_{n_iter}``, and ``∂L/∂norm`` per problem ``(P,)`` with a
    global norm."""
    _check_device(a)
    problems, m, _ = a.shape
    grad_a = torch.empty_like(a)
    grad_norm = a.new_empty(problems) if norm is not None else a.new_empty(0)
    config = launch.launch_config("_pinv_bwd", m, norm is not None)
    launch.launch("_pinv_bwd", problems, config, a, a if norm is None else norm, saved if saved.numel() else a,
                  grad_z, grad_a, grad_norm if norm is not None else a, m, n_iter, n_iter=n_iter)
    return grad_a, grad_norm


@pinv_backward.register_fake
def _(a, norm, saved, grad_z, n_iter):
    return torch.empty_like(a), a.new_empty(a.shape[0] if norm is not None else 0)


def _setup(ctx, inputs, output):
    a, norm, n_iter, save = inputs
    ctx.save_for_backward(a, norm, output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # no zero-filled gradient of the iterates (a memset launch of their size)
    ctx.n_iter, ctx.saved_iterates = n_iter, save


def _grad(ctx, grad_z, _grad_saved):
    if not ctx.saved_iterates:
        raise RuntimeError("lra_pinv::forward ran with save=False, so it kept nothing to differentiate: call "
                           "fused_pinv, which saves the iterates whenever autograd records the call")
    a, norm, saved = ctx.saved_tensors
    grad_a, grad_norm = pinv_backward(a, norm, saved, grad_z.contiguous(), ctx.n_iter)
    return grad_a, None if norm is None else grad_norm.sum().reshape(norm.shape), None, None


pinv_forward.register_autograd(_grad, setup_context=_setup)

# FLOP formulas for torch.utils.flop_counter (it does not see inside the Triton kernels), 2·m³ per m × m product:
# a forward step runs four (AZ, AZ·W, AZ·inner, Z·S), a backward step eleven (three recomputing, eight of the chain
# rule; kernels.pinv.backward).
FORWARD_PRODUCTS, BACKWARD_PRODUCTS = 4, 11


@register_flop_formula(torch.ops.lra_pinv.forward)
def _(a, norm, n_iter, save, *args, out_shape=None, **kwargs) -> int:
    problems, m, _ = a
    return FORWARD_PRODUCTS * n_iter * problems * 2 * m**3


@register_flop_formula(torch.ops.lra_pinv.backward)
def _(a, norm, saved, grad_z, n_iter, *args, out_shape=None, **kwargs) -> int:
    problems, m, _ = a
    return BACKWARD_PRODUCTS * n_iter * problems * 2 * m**3


def fused_pinv(a: Tensor, n_iter: int, norm: Tensor | None = None) -> Tensor:
    """``n_iter`` Newton–Schulz steps from ``Z₀ = Aᵀ / norm`` on ``a`` ``(P, m, m)`` float32 -> ``(P, m, m)``.

    ``norm``: None (per problem, ``max(‖A‖₁ ‖A‖∞, tiny)`` in the kernel) or a one-element float32 tensor
    (global, differentiable). ``1 ≤ m ≤ 64`` (:func:`kernels.pinv.launch.takes`). Differentiable in ``a``
    and ``norm``; the iterates are kept only when autograd records the call. O(n_iter · m³) per problem.
    """
    if a.dim() != 3 or a.shape[1] != a.shape[2] or not launch.takes(a.shape[1]):
        raise ValueError(
            f"fused_pinv expects (P, m, m) float32 matrices with 1 <= m <= {launch.MAX_M}, got {tuple(a.shape)}"
        )
    if n_iter < 1:
        raise ValueError(f"pinv_iters must be >= 1, got {n_iter}")
    launch.check_float32(a, *([] if norm is None else [norm]))
    if norm is not None and norm.numel() != 1:
        raise ValueError(f"fused_pinv takes one global norm (a one-element tensor), got shape {tuple(norm.shape)}")
    save = torch.is_grad_enabled() and (a.requires_grad or (norm is not None and norm.requires_grad))
    z, _ = pinv_forward(a.contiguous(), None if norm is None else norm.reshape(()), n_iter, save)
    return z
