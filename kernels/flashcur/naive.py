"""FlashCUR's plain PyTorch reference (François et al. 2025, §5.2; docs/design.md §2 "FlashCUR"), what the ops of
:mod:`kernels.flashcur.ops` and the layer of :mod:`attention.flashcur` are tested against: each kernel's equation on
whole matrices, and the layer written out densely per (batch, head) in float64. Independent of the kernels.

With ``s = 1/√d``, rows ``I`` and columns ``J`` selected::

    RV = softmax(s·Q_I Kᵀ + pad mask) V     (kernel a; lse in base 2)
    U  = softmax(s·Q_I K_Jᵀ) over valid J    (kernel b)
    Y  = softmax(s·Q K_Jᵀ) W, Y[I] = RV      (kernel c)
"""

from __future__ import annotations

import math

import torch


def rows(q_sel, k, v, key_mask):
    """Kernel (a): ``(RV, lse)`` for ``q_sel`` ``(B, H, m, d)``, ``k, v`` ``(B, H, n, d)``, ``key_mask`` bool ``(B, n)``:
    ``RV`` ``(B, H, m, d)`` and the base-2 log-sum-exp of ``R``'s rows ``(B, H, m)``. Differentiable."""
    scale = q_sel.shape[-1] ** -0.5
    logits = (q_sel @ k.transpose(-1, -2) * scale).masked_fill(~key_mask[:, None, None, :], -math.inf)
    return torch.softmax(logits, -1) @ v, torch.logsumexp(logits, -1) / math.log(2)


def core(q_sel, k_sel, valid_k):
    """Kernel (b): ``U = softmax(s·Q_I K_Jᵀ)`` over the valid key slots (``valid_k`` bool ``(B, H, m)``), ``(B, H, m, m)``."""
    scale = q_sel.shape[-1] ** -0.5
    return torch.softmax((q_sel @ k_sel.transpose(-1, -2) * scale).masked_fill(~valid_k[:, :, None, :], -math.inf), -1)


def columns_times(q, k_sel, valid_k, w):
    """Kernel (c) before the rows ``I`` are overwritten: ``softmax(s·Q K_Jᵀ) W`` over the valid slots, ``(B, H, n, d)``."""
    scale = q.shape[-1] ** -0.5
    logits = (q @ k_sel.transpose(-1, -2) * scale).masked_fill(~valid_k[:, :, None, :], -math.inf)
    return torch.softmax(logits, -1) @ w


def output(q, k_sel, valid_k, w, rv, index):
    """Kernel (c): :func:`columns_times` with rows ``index`` ``(B, H, m)`` set to ``rv`` ``(B, H, m, d)``."""
    return columns_times(q, k_sel, valid_k, w).scatter(2, index[..., None].expand(*index.shape, q.shape[-1]), rv)


def dense_cur(q, k, v, key_mask, index, pinv_iters, overwrite_rows=True):
    """The layer written out densely per (batch, head) in float64 (I = J, all selected tokens real): ``C``, ``R``,
    ``U = C[I]``, ``U``'s pseudo-inverse by ``pinv_iters`` steps from ``Z₀ = Uᵀ / (‖U‖₁ ‖U‖∞)``, ``Y = C U⁺ R V``
    (rows ``I`` replaced by ``R V``) -> float64 ``(B, H, n, d)`` on the CPU."""
    out = torch.empty(q.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            Q, K, V = (x[b, h].detach().double().cpu() for x in (q, k, v))
            idx = index[b, h].cpu()
            scores = Q @ K.T / math.sqrt(Q.shape[1])  # (n, n)
            C = torch.softmax(scores[:, idx], dim=1)
            R = torch.softmax(scores[idx].masked_fill(~key_mask[b].cpu(), -math.inf), dim=1)
            U = C[idx]
            Z = U.T / (U.abs().sum(0).max() * U.abs().sum(1).max())
            eye = torch.eye(len(idx), dtype=torch.float64)
            for _ in range(pinv_iters):
                UZ = U @ Z
                Z = 0.25 * Z @ (13 * eye - UZ @ (15 * eye - UZ @ (7 * eye - UZ)))
            Y = C @ (Z @ (R @ V))
            if overwrite_rows:
                Y[idx] = R @ V
            out[b, h] = Y
    return out
