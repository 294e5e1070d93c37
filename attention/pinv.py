"""Iterative Moore–Penrose pseudo-inverse (Nyströmformer, Xiong et al. 2021, eq. 16; DESIGN §2).

``Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞)`` (max absolute column sum × max absolute row sum, per batch and head),
then ``Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ)))`` ``n_iter`` times. The iteration is a polynomial in
``A Z``, so it keeps the block structure of ``A`` (CUR and Nyström put an identity block on invalid
landmarks; see :mod:`attention.cur`) and stays finite on rank-deficient matrices (``Z₀`` lies in
the row space of ``Aᵀ`` and the iteration only multiplies by ``A``/``Z``).

Precision: the iteration diverges in fp16/bf16, so it always runs in float32 with autocast
disabled (float64 inputs stay float64, for gradcheck); the result has the compute dtype.
Cost: O(n_iter · m³) for ``m × m`` matrices.
"""

from __future__ import annotations

import torch


def iterative_pinv(matrix: torch.Tensor, n_iter: int = 6) -> torch.Tensor:
    """Approximate pseudo-inverse of ``matrix`` ``(..., m, m)`` after ``n_iter`` iterations -> ``(..., m, m)``."""
    if n_iter < 1:
        raise ValueError(f"pinv_iters must be >= 1, got {n_iter}")
    if matrix.shape[-1] != matrix.shape[-2]:
        raise ValueError(f"iterative_pinv expects square (..., m, m) matrices, got shape {tuple(matrix.shape)}")
    dtype = torch.float64 if matrix.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=matrix.device.type, enabled=False):
        a = matrix.to(dtype)
        absolute = a.abs()
        col_sum = absolute.sum(-2).amax(-1)  # ‖A‖₁, (...)
        row_sum = absolute.sum(-1).amax(-1)  # ‖A‖∞, (...)
        norm = (col_sum * row_sum).clamp_min(torch.finfo(dtype).tiny)[..., None, None]
        z = a.transpose(-1, -2) / norm
        eye = torch.eye(a.shape[-1], dtype=dtype, device=a.device)
        for _ in range(n_iter):
            az = a @ z
            z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z
