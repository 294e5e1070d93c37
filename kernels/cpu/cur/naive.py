"""Plain PyTorch reference of CUR's one-node training path (:mod:`kernels.cpu.cur.ops`): the method's equations with
``C`` and ``R`` materialised, the selected rows taken by ``gather``, autograd through every step
(tests/kernels/test_cur_cpu.py compares the node's values and gradients against it in float64)."""

from __future__ import annotations

from typing import Callable

import torch


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
