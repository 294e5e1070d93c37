"""Nyström attention (Nyströmformer, Xiong et al. 2021, eq. 14–16; DESIGN §2).

With ``m`` landmarks ``Q̃, K̃`` (segment means of Q and K over real tokens)::

    k1 = softmax(Q K̃ᵀ/√d)     (n × m)
    k2 = softmax(Q̃ K̃ᵀ/√d)     (m × m)
    k3 = softmax(Q̃ Kᵀ/√d + pad mask)  (m × n)
    Y  = k1 pinv(k2) (k3 V)  [+ depthwise conv over V along the sequence, one kernel per head]

Decisions: segments are mask-aware and of mixed sizes: the real token of rank ``r`` (among the
``n_real`` real tokens) belongs to segment ``⌊r·m/n_real⌋``, so any ``n`` works and pad rows never
enter a mean. When ``n_real ≤ m`` every real token is its own landmark and the empty segments are
invalid: masked as keys, identity block in ``k2`` (as in :mod:`attention.cur`). Then ``k1 = k2 = k3``
restricted to real tokens is the exact attention matrix ``A``, so ``Y = A pinv(A) A V`` equals exact
attention ``A V`` (apart from the conv) only as far as the iterative ``pinv`` (eq. 16) has converged
on ``A``, which takes about 20 iterations, not the default 6. Measured (float64, n = 40 with 40 and
23 real tokens, d = 8, m = 40 or 64, q, k, v ~ N(0, 1), 10 seeds; max |Y − A V| over real rows):
3.1–3.7e-2 at 6 iterations, 1.7–3.0e-3 at 10, ≤ 1.2e-4 at 15, ≤ 2.4e-6 at 20 (1e-14 for most
seeds); with q, k halved, 1.6–2.5e-2 at 6. The conv (``conv_kernel_size``, 35 in the LRA code;
null disables it) sees V with pad rows zeroed. Landmarks and ``pinv`` run in float32 with autocast
disabled (float64 stays float64); ``pinv_init`` picks the scale of ``pinv``'s start (``per_head``,
eq. 16 as written, or ``global``, the public code's; :mod:`attention.pinv`). Cost O(nmd + m³) time,
O(nm) memory. Default m = 64 (the paper's LRA numbers use 128/256).
"""

from __future__ import annotations

import torch
from torch import nn

from attention.cur import check_positive_int
from attention.pinv import check_pinv_init, iterative_pinv
from attention.scores import SoftmaxScore


def segment_means(x: torch.Tensor, key_mask: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask-aware segment means of ``x`` ``(B, H, n, d)`` -> landmarks ``(B, H, m, d)`` and validity ``(B, m)``."""
    batch, heads, n, d = x.shape
    rank = key_mask.long().cumsum(-1) - 1  # (B, n): rank among real tokens
    n_real = key_mask.sum(-1, keepdim=True).clamp_min(1)  # (B, 1)
    segment = torch.where(key_mask, rank * m // n_real, m)  # (B, n); pads -> overflow segment m
    counts = torch.zeros(batch, m + 1, dtype=x.dtype, device=x.device).scatter_add_(
        1, segment, torch.ones_like(segment, dtype=x.dtype)
    )[:, :m]
    index = segment[:, None, :, None].expand(batch, heads, n, d)
    sums = torch.zeros(batch, heads, m + 1, d, dtype=x.dtype, device=x.device).scatter_add(2, index, x)[:, :, :m]
    return sums / counts.clamp_min(1)[:, None, :, None], counts > 0


class NystromAttention(nn.Module):
    """Drop-in Nyström attention with ``num_landmarks`` segment-mean landmarks (see module doc)."""

    def __init__(self, num_heads: int, head_dim: int, num_landmarks: int = 64, pinv_iters: int = 6,
                 conv_kernel_size: int | None = 35, pinv_init: str = "per_head"):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_landmarks = check_positive_int(num_landmarks, "num_landmarks")
        self.pinv_iters = check_positive_int(pinv_iters, "pinv_iters")
        self.pinv_init = check_pinv_init(pinv_init)
        self.score = SoftmaxScore()
        self.conv = None
        if conv_kernel_size is not None:
            size = check_positive_int(conv_kernel_size, "conv_kernel_size")
            if size % 2 == 0:
                raise ValueError(f"attention.conv_kernel_size must be odd (same-length output), got {size}")
            self.conv = nn.Conv2d(num_heads, num_heads, (size, 1), padding=(size // 2, 0), groups=num_heads, bias=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        out_dtype = v.dtype
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        with torch.autocast(device_type=q.device.type, enabled=False):
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
            m = min(self.num_landmarks, q.shape[2])
            q_land, valid = segment_means(q, key_mask, m)  # (B, H, m, d), (B, m)
            k_land, _ = segment_means(k, key_mask, m)
            valid_keys = valid[:, None, None, :]
            k1 = self.score(q, k_land, valid_keys)  # (B, H, n, m)
            k2 = self.score(q_land, k_land, valid_keys).masked_fill(~valid[:, None, :, None], 0.0)
            k2 = k2 + torch.diag_embed((~valid).to(dtype))[:, None]  # identity on empty segments
            k3 = self.score(q_land, k, key_mask[:, None, None, :])  # (B, H, m, n)
            y = k1 @ (iterative_pinv(k2, self.pinv_iters, self.pinv_init) @ (k3 @ v))
            if self.conv is not None:
                y = y + self.conv(v * key_mask[:, None, :, None])
        return y.to(out_dtype)

    def extra_repr(self) -> str:
        return f"num_landmarks={self.num_landmarks}, pinv_iters={self.pinv_iters}, pinv_init={self.pinv_init!r}"
