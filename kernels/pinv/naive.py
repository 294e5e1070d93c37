"""The pseudo-inverse's plain PyTorch reference (Nyströmformer eq. 16), what the fused kernels, the C++ CPU kernel
and the PyTorch form of :mod:`kernels.pinv.ops` are tested against: matrix by matrix in float64, norms from
``torch.linalg.matrix_norm``, the polynomial expanded. Independent of the ops it checks."""

from __future__ import annotations

import torch


def reference_pinv(a: torch.Tensor, n_iter: int, init: str = "per_head") -> torch.Tensor:
    """Matrix by matrix in float64: ``Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞)`` from ``torch.linalg.matrix_norm`` (each matrix's own
    norms, or the largest of each over all matrices for ``global``), then ``Z ← Z (13I − 15X + 7X² − X³) / 4``
    with ``X = A Z`` (eq. 16 with the polynomial expanded). ``a`` ``(..., m, m)`` -> float64 ``(..., m, m)``,
    differentiable in ``a`` (through the norms too, as the forms it checks)."""
    m = a.shape[-1]
    flat = a.double().reshape(-1, m, m)
    norm_1 = torch.linalg.matrix_norm(flat, ord=1)  # (P,): max absolute column sum of each matrix
    norm_inf = torch.linalg.matrix_norm(flat, ord=float("inf"))  # max absolute row sum
    if init == "global":
        norm_1, norm_inf = norm_1.max().expand(len(flat)), norm_inf.max().expand(len(flat))
    eye = torch.eye(m, dtype=torch.float64, device=a.device)
    out = []
    for x, n1, ninf in zip(flat, norm_1, norm_inf):
        z = x.T / (n1 * ninf)
        for _ in range(n_iter):
            p = x @ z
            z = z @ (13 * eye - 15 * p + 7 * torch.linalg.matrix_power(p, 2) - torch.linalg.matrix_power(p, 3)) / 4
        out.append(z)
    return torch.stack(out).reshape(a.shape)
