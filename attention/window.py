"""Sliding-window (banded) softmax attention, the linear-cost ``O_base`` of LiZA (TPTT Alg. 1 step 4,
"optionally truncated for long sequences").

Query i attends to the real keys j with ``|i − j| ≤ window`` (non-causal, ``window`` tokens each side):
``Y_i = softmax_{j : |i−j| ≤ w, j real}(q_i·k_j / √d) v_j``. Computed block by block without an n×n
matrix: queries are cut into blocks of ``b`` tokens and each block scores the ``b + 2w`` keys around it,
so time is O(n (b + 2w) d) and memory O(n (b + 2w)) per head. ``window ≥ n − 1`` is exact softmax.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

MIN_QUERY_BLOCK = 64  # queries per block when the window is smaller (keeps the matmuls reasonably sized)


def sliding_window_softmax(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor,
    window: int,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Banded softmax attention; ``q, k, v`` ``(B, H, n, d)``, ``key_mask`` bool ``(B, n)`` -> ``(B, H, n, d)``.

    ``dropout_p`` is applied to the attention probabilities (pass 0 at evaluation). Rows of pad queries whose
    window holds no real key are finite but meaningless (they are excluded by pooling).
    """
    if window < 0:
        raise ValueError(f"attention.base_window must be null or >= 0, got {window}")
    n, d = q.shape[-2:]
    window = min(window, n)
    block = min(max(window, MIN_QUERY_BLOCK), n)
    n_blocks = math.ceil(n / block)
    tail = n_blocks * block - n
    span = block + 2 * window  # keys seen by one query block
    q_blocks = F.pad(q, (0, 0, 0, tail)).unflatten(2, (n_blocks, block))  # (B, H, Nb, b, d)
    k_pad = F.pad(k, (0, 0, window, window + tail))  # key of token j sits at j + window
    v_pad = F.pad(v, (0, 0, window, window + tail))
    mask_pad = F.pad(key_mask, (window, window + tail), value=False)
    k_slab = k_pad.unfold(2, span, block)  # (B, H, Nb, d, span)
    v_slab = v_pad.unfold(2, span, block).transpose(-1, -2)  # (B, H, Nb, span, d)
    mask_slab = mask_pad.unfold(1, span, block)  # (B, Nb, span)
    offsets = torch.arange(span, device=q.device) - torch.arange(block, device=q.device)[:, None]  # j_local − i_local
    band = (offsets >= 0) & (offsets <= 2 * window)  # (b, span): |i − j| ≤ w
    allowed = band & mask_slab[:, None, :, None, :]  # (B, 1, Nb, b, span)
    scores = (q_blocks @ k_slab) / math.sqrt(d)
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1).to(v.dtype)  # >= fp32
    if dropout_p > 0:
        probs = F.dropout(probs, p=dropout_p)
    return (probs @ v_slab).flatten(2, 3)[:, :, :n]
