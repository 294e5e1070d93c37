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

Its form (``form``; :mod:`attention.impl` chooses it with the variant's, on device and dtype): ``triton``, the fused
kernels of :mod:`kernels.pinv` (float32 with ``m ≤ 64``: one launch forward, the init and all ``n_iter`` steps, one
program per matrix, and one backward, as the custom op ``lra_pinv::forward``, also on ``meta``, where its fake
implementation gives the shapes; with ``global`` the shared norm is computed in PyTorch and passed in; other
matrices the PyTorch form); ``cpu``, the C++ kernel of :mod:`kernels.pinv.cpu` where it takes the matrices (float32,
eager); ``pytorch``, :func:`kernels.pinv.ops.steps` (float64 for gradcheck, and every other device). All forms compute
the same iterates and the same gradient (through the norms too), to float32 rounding. The arguments are checked
here, once (:func:`check_arguments`); the forms and their autograd live in :mod:`kernels.pinv.ops`, the plain
reference in :mod:`kernels.pinv.naive`.
"""

from __future__ import annotations

import torch

from kernels.common.precision import autocast_off
from kernels.pinv import ops

PINV_INITS = ("per_head", "global")


def check_pinv_init(init: str) -> str:
    """``init`` if it is one of :data:`PINV_INITS`, else a config error naming ``attention.pinv_init``."""
    if init not in PINV_INITS:
        raise ValueError(
            f"attention.pinv_init must be one of {list(PINV_INITS)} (per_head: the paper's Z₀ per batch row and "
            f"head; global: one maximum over the batch, as mlpen/Nystromformer and HF), got {init!r}"
        )
    return init


def check_arguments(matrix: torch.Tensor, n_iter: int, init: str) -> None:
    """The pseudo-inverse's checks, made once per call: ``n_iter ≥ 1``, square matrices, a known ``init``."""
    ops.check_iterations(n_iter)
    if matrix.shape[-1] != matrix.shape[-2]:
        raise ValueError(f"iterative_pinv expects square (..., m, m) matrices, got shape {tuple(matrix.shape)}")
    check_pinv_init(init)


def default_form(matrix: torch.Tensor) -> str:
    """The form ``auto`` gives a lone pseudo-inverse (no variant's table row): ``triton`` on CUDA and ``meta``, ``cpu``
    on the CPU (:mod:`attention.impl`)."""
    return "cpu" if matrix.device.type == "cpu" else "triton"


def iterative_pinv(matrix: torch.Tensor, n_iter: int = 6, init: str = "per_head", recompute: bool = False,
                   form: str | None = None) -> torch.Tensor:
    """Approximate pseudo-inverse of ``matrix`` ``(..., m, m)`` after ``n_iter`` iterations -> ``(..., m, m)``.

    ``init``: ``per_head`` scales ``Z₀`` by each matrix's own norms, ``global`` by the maxima over all
    leading dimensions (see the module doc). ``form``: ``triton``, ``cpu`` or ``pytorch`` (the module doc; None:
    :func:`default_form`). ``recompute``: the non-Triton forms keep only ``matrix`` for the backward and run the
    iteration again there (FlashCUR: no ``5 · n_iter`` matrices of ``m × m`` kept per head).
    """
    check_arguments(matrix, n_iter, init)
    with autocast_off(matrix.device.type):
        a = matrix.float() if matrix.dtype != torch.float64 else matrix
        return ops.pinv(a, n_iter, init, form or default_form(matrix), recompute=recompute)


def pytorch_pinv(matrix: torch.Tensor, n_iter: int = 6, init: str = "per_head") -> torch.Tensor:
    """:func:`iterative_pinv` in its ``pytorch`` form on any device: ``bmm``/``baddbmm`` per step, one autograd node
    (:class:`kernels.pinv.ops.Iterations`); what ``python -m lra.bench pinv`` compares the Triton kernels with."""
    return iterative_pinv(matrix, n_iter, init, form="pytorch")
