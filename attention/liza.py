"""LiZA attention (TPTT, Furfaro 2025, §3.2 eq. 4 and Alg. 1): softmax and linear attention mixed by a gate.

``O = (1 − μ)·O_base + μ·O_lin`` over the same ``q, k, v`` (the projections ``q_proj … out_proj`` of
:class:`models.blocks.MultiHeadAttention` are shared, so a softmax checkpoint loads into LiZA unchanged).

* ``O_base``: exact softmax (``base_window: null``, via SDPA) or sliding-window softmax over ``base_window``
  tokens each side (:mod:`attention.window`), which keeps the whole layer linear in n.
* ``O_lin``: the ``linear`` node, a ``_partial_`` factory from ``configs/attention/linear/`` —
  ``elu`` (:class:`attention.linear.EluLinearAttention`) or ``delta``
  (:class:`attention.linear.DeltaRuleAttention`, chunkwise delta rule, forward + reversed, averaged).
* μ, "memory as gate" (MaG): by default a buffer ``memory_gate`` (a scalar, saved in checkpoints) that the
  Lightning callback :class:`lra.runtime.callbacks.MemoryGateSchedule` ramps 0.01 → 0.5 over the first 100 steps
  (TPTT §4.2); without the callback it stays at ``mag``. With ``learned_gate: true`` μ is instead
  ``sigmoid(gate_logit)``, one learned logit per head initialised to ``logit(mag)`` (TPTT Alg. 1 step 5
  speaks of a learned gate); the callback then leaves the layer alone.

**Decisions.** TPTT is causal; our encoder is bidirectional, so both branches are non-causal. μ = 0 returns
exactly ``O_base`` and μ = 1 exactly ``O_lin`` (both branches are always computed).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attention.config_checks import check_dropout
from attention.window import sliding_window_softmax


class LiZAAttention(nn.Module):
    """``(1 − μ)·softmax-attention + μ·linear-attention`` over ``(B, H, n, d)`` tensors with a key padding mask."""

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        linear: Callable[..., nn.Module],
        base_window: int | None = None,
        dropout: float = 0.0,
        mag: float = 0.01,
        learned_gate: bool = False,
    ):
        super().__init__()
        check_dropout(dropout)
        if base_window is not None and base_window < 0:
            raise ValueError(f"attention.base_window must be null (full softmax) or >= 0, got {base_window}")
        if not callable(linear):  # `attention.linear=delta` replaces the config node with the string "delta"
            raise ValueError(
                f"attention.linear must be a linear-branch config node, got {linear!r}: choose the branch with the "
                f"config group override attention/linear={linear} ('/', not '.'), e.g. attention=liza attention/linear=delta"
            )
        if not 0.0 <= mag <= 1.0 or (learned_gate and mag in (0.0, 1.0)):
            raise ValueError(f"attention.mag must be in [0, 1] (open interval (0, 1) with learned_gate), got {mag}")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.linear = linear(num_heads=num_heads, head_dim=head_dim)
        self.base_window = base_window
        self.dropout = dropout
        if learned_gate:
            self.gate_logit = nn.Parameter(torch.full((num_heads,), math.log(mag / (1.0 - mag))))
        else:
            self.register_buffer("memory_gate", torch.tensor(float(mag)))

    @property
    def mag(self) -> torch.Tensor:
        """Current μ: a scalar tensor, or ``(H,)`` for a learned gate."""
        if hasattr(self, "gate_logit"):
            return torch.sigmoid(self.gate_logit)
        return self.memory_gate

    def base(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``O_base``: full softmax (SDPA) or sliding-window softmax; ``(B, H, n, d)``."""
        dropout_p = self.dropout if self.training else 0.0
        if self.base_window is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :], dropout_p=dropout_p)
        return sliding_window_softmax(q, k, v, key_mask, self.base_window, dropout_p)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        mu = self.mag.to(q.dtype)
        if mu.ndim:  # per-head learned gate -> (1, H, 1, 1)
            mu = mu[None, :, None, None]
        return (1 - mu) * self.base(q, k, v, key_mask) + mu * self.linear(q, k, v, key_mask)
