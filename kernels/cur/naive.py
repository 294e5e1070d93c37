"""CUR's one plain PyTorch reference (François et al. 2025, §4–5; docs/design.md §2 "CURformer", "FlashCUR"), what
every kernel form of the method is tested against: FlashCUR's Triton ops (:mod:`kernels.cur.ops`) and layer
(:mod:`attention.flashcur`), each kernel's equation on whole matrices and the layer written out densely per
(batch, head) in float64; and the CPU training node (:mod:`kernels.cur.cpu`), the method's equations with ``C`` and
``R`` materialised, autograd through every step (:func:`cur_attention`). Independent of the kernels.

With ``s = 1/√d``, rows ``I`` and columns ``J`` selected::

    RV = softmax(s·Q_I Kᵀ + pad mask) V     (kernel a; lse in base 2)
    U  = softmax(s·Q_I K_Jᵀ) over valid J    (kernel b)
    Y  = softmax(s·Q K_Jᵀ) W, Y[I] = RV      (kernel c)
"""

from __future__ import annotations

import math
from typing import Callable

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


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` ``(B, H, m)`` of ``x`` ``(B, H, n, e)`` -> ``(B, H, m, e)``."""
    return x.gather(2, index[..., None].expand(*index.shape, x.shape[-1]))


def cur_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor, index_q: torch.Tensor,
                  index_k: torch.Tensor, score: Callable[..., torch.Tensor],
                  pinv: Callable[[torch.Tensor], torch.Tensor], overwrite_rows: bool = True) -> torch.Tensor:
    """``Y = C (U⁺ (R V))``, then ``Y[I] = R V`` when ``overwrite_rows``, ``(B, H, n, d)``::

        C = s(Q, K_J, valid J)   (n × m),   R = s(Q_I, K, key_mask)   (m × n),
        U = C[I] on valid slots, the identity's rows on invalid (pad) ones

    for ``q, k, v`` ``(B, H, n, d)``, bool ``key_mask`` ``(B, n)``, long ``index_q``, ``index_k`` ``(B, H, m)``, a
    score ``s(q, k, key_mask, q_index, k_index)`` (:mod:`attention.scores`) and ``pinv`` (``U ↦ U⁺``).
    """
    batch, heads, n, _ = q.shape
    m = index_q.shape[-1]
    positions_mask = key_mask[:, None, :].expand(batch, heads, n)
    valid_q, valid_k = positions_mask.gather(2, index_q), positions_mask.gather(2, index_k)  # (B, H, m)
    c = score(q, gather_rows(k, index_k), valid_k[:, :, None, :], None, index_k)  # (B, H, n, m)
    r = score(gather_rows(q, index_q), k, key_mask[:, None, None, :], index_q, None)  # (B, H, m, n)
    rv = r @ v  # (B, H, m, d)
    u = torch.where(valid_q[..., None], gather_rows(c, index_q), torch.eye(m, dtype=q.dtype))  # (B, H, m, m)
    y = c @ (pinv(u) @ rv)
    return y.scatter(2, index_q[..., None].expand_as(rv), rv) if overwrite_rows else y
