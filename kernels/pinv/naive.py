"""The pseudo-inverse's one plain PyTorch reference (Nyströmformer eq. 16), what every form is tested against: the
fused Triton kernels (:mod:`kernels.pinv.ops`), the C++ CPU kernel (:mod:`kernels.pinv.cpu`) and the PyTorch form.
:func:`reference_pinv`: matrix by matrix in float64, norms from ``torch.linalg.matrix_norm``, the polynomial expanded;
:func:`steps`: the steps written as the equation reads, with the matrices each step keeps (what the C++ kernel's
forward keeps for its backward). Independent of the ops it checks."""

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


def steps(a: torch.Tensor, z: torch.Tensor, n_iter: int) -> tuple[torch.Tensor, list[tuple[torch.Tensor, ...]]]:
    """``n_iter`` steps ``Z ← Z S``, ``S = ¼ (13I − AZ (15I − AZ (7I − AZ)))`` on ``(P, m, m)`` matrices, written as
    the equation reads -> ``(Z_last, [(Z, AZ, W = 7I − AZ, inner = 15I − AZ W, S) per step])``."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    kept = []
    for _ in range(n_iter):
        az = a @ z
        w = 7 * eye - az
        inner = 15 * eye - az @ w
        s = (13 * eye - az @ inner) / 4
        kept.append((z, az, w, inner, s))
        z = z @ s
    return z, kept
