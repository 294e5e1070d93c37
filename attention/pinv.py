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
"""

from __future__ import annotations

import torch

from attention.precision import autocast_off

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
    leading dimensions (see the module doc).
    """
    if n_iter < 1:
        raise ValueError(f"pinv_iters must be >= 1, got {n_iter}")
    if matrix.shape[-1] != matrix.shape[-2]:
        raise ValueError(f"iterative_pinv expects square (..., m, m) matrices, got shape {tuple(matrix.shape)}")
    check_pinv_init(init)
    dtype = torch.float64 if matrix.dtype == torch.float64 else torch.float32
    with autocast_off(matrix.device.type):
        a = matrix.to(dtype)
        absolute = a.abs()
        col_sum = absolute.sum(-2).amax(-1)  # ‖A‖₁, (...)
        row_sum = absolute.sum(-1).amax(-1)  # ‖A‖∞, (...)
        if init == "global":
            col_sum, row_sum = col_sum.amax(), row_sum.amax()  # one maximum over batch and heads, ()
        norm = (col_sum * row_sum).clamp_min(torch.finfo(dtype).tiny)[..., None, None]
        shape, m = a.shape, a.shape[-1]
        a = a.reshape(-1, m, m)  # one batch dimension for bmm/baddbmm
        z = a.transpose(-1, -2) / norm.reshape(-1, 1, 1)
        eye = torch.eye(m, dtype=dtype, device=a.device)
        eye_7, eye_15, eye_13_4 = 7 * eye, 15 * eye, 3.25 * eye
        for _ in range(n_iter):  # Z ← ¼ Z (13I − AZ(15I − AZ(7I − AZ))); ¼ folded into the last product
            az = torch.bmm(a, z)
            inner = torch.baddbmm(eye_15, az, eye_7 - az, alpha=-1)  # 15I − AZ(7I − AZ)
            z = torch.bmm(z, torch.baddbmm(eye_13_4, az, inner, alpha=-0.25))  # Z (13I − AZ·inner) / 4
    return z.reshape(shape)
