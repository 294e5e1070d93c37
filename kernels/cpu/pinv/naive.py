"""The plain PyTorch reference of ``pinv.cpp``'s steps, what its tests compare against (forward, the matrices kept
per step, and, through autograd, the backward)."""

from __future__ import annotations

import torch


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
