"""Linformer attention (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity").

Eq. 7: ``head_i = softmax(Q (E_i K)ᵀ / √d) (F_i V)``, with learned projections ``E_i, F_i ∈ R^{k × n}`` that
mix the n keys and values down to k rows, so the weights are ``n × k``: cost O(n k d) time, O(n k) memory.

Shapes: ``q, k, v`` ``(B, H, n, d)``, ``key_mask`` bool ``(B, n)`` -> ``(B, H, n, d)``; parameters ``E`` (and
``F`` unless ``share_kv``) of shape ``(H, k, max_length)`` (``per_head``) or ``(1, k, max_length)``.

Length-fixed: E and F have one column per position up to ``max_length`` (the task's, ``${task.max_length}``
in the config). A batch shorter than that uses the first n columns, which is the same as zero-padding it to
``max_length`` (as the linformer package slices its projections). Pad keys and values are zeroed before
projecting, so they add nothing to ``E K`` and ``F V``; real tokens' outputs therefore do not change when
pads are appended, but they do depend on *where* a token sits (column j of E belongs to position j), and a
sequence longer than ``max_length`` is refused.

Decisions (the tables' Linformer numbers come from Nyströmformer's LRA code, mlpen/Nystromformer
``LRA/code/attention_linformer.py``, which the Proxyformer paper runs and whose "Linformer-256*" it quotes):
* ``share_kv: true`` (E = F, the paper's "key-value sharing", §4) and ``per_head: true`` (one E per head),
  initialised N(0, ``init_std`` = 0.02²), as that code. ``share_kv: false`` / ``per_head: false`` give the
  paper's unshared and headwise-shared forms (the linformer package's default: separate E, F shared by heads).
* That code also shares one E across all layers of the model (a class attribute); here each layer has its
  own (a module cannot share with its siblings without global state). Not pinned: whether that matters.
* No attention dropout (that code has none).
"""

from __future__ import annotations

import torch
from torch import nn

from attention.config_checks import check_positive_int


class LinformerAttention(nn.Module):
    """Softmax attention over k learned mixtures of the (zero-padded) keys and values (eq. 7)."""

    def __init__(self, num_heads: int, head_dim: int, max_length: int, k: int = 128, share_kv: bool = True,
                 per_head: bool = True, init_std: float = 0.02):
        super().__init__()
        check_positive_int(max_length, "max_length")
        check_positive_int(k, "k")
        if k > max_length:
            raise ValueError(f"attention.k must be <= attention.max_length (the task's, {max_length}), got {k}: "
                             "projecting n keys to more than n rows cannot reduce anything")
        if not init_std > 0:
            raise ValueError(f"attention.init_std must be > 0, got {init_std!r}")
        self.head_dim = head_dim
        self.max_length = max_length
        shape = (num_heads if per_head else 1, k, max_length)
        self.E = nn.Parameter(torch.randn(shape) * init_std)
        self.F = None if share_kv else nn.Parameter(torch.randn(shape) * init_std)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        n = k.shape[-2]
        if n > self.max_length:  # a shape, known when traced: no host sync
            raise ValueError(f"Linformer got a sequence of {n} tokens, longer than attention.max_length = "
                             f"{self.max_length} (its projections have one column per position)")
        real = key_mask[:, None, :, None].to(k.dtype)
        e = self.E[..., :n].to(k.dtype)  # (H or 1, k, n)
        f = e if self.F is None else self.F[..., :n].to(v.dtype)
        keys = e @ (k * real)  # (B, H, k, d): E K, pads zeroed
        values = f @ (v * real)  # (B, H, k, d): F V
        weights = torch.softmax((q @ keys.transpose(-1, -2)) * self.head_dim**-0.5, dim=-1)  # (B, H, n, k)
        return weights @ values
