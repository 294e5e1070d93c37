"""Position information, one config group ``model/positions=learned|sinusoidal|rotary|none``.

Each kind is built by the encoder as ``positions(max_length=, d_model=)`` and stored as its
``position_embedding`` (so the learned table keeps the state-dict key ``position_embedding.weight`` of
every earlier checkpoint). It plays two roles, each an identity where the kind has no such part:

- ``add(x)`` adds absolute positions to the embeddings ``x`` ``(B, n, d_model)``;
- ``wrap(attention)`` turns the attention factory ``attention(num_heads=, head_dim=) -> module`` into
  one whose modules see rotated queries and keys.

Kinds:

- ``learned``: a trained table ``P`` ``(max_length, d_model)``, ``x + P[:n]`` (the LRA reference code).
- ``sinusoidal``: the fixed table of Vaswani et al. 2017 §3.5, ``P[i, 2t] = sin(i ω_t)``,
  ``P[i, 2t+1] = cos(i ω_t)``, ``ω_t = base^(−2t/d_model)``.
- ``rotary``: RoPE (Su et al. 2021, RoFormer, eq. 34): per head, the pair ``(x_t, x_{t+d/2})`` of a query
  or key at position ``i`` is rotated by the angle ``i θ_t``, ``θ_t = base^(−2t/d)`` (the half-split
  pairing of GPT-NeoX; the same maths as the paper's interleaved pairs up to a fixed permutation of
  the head's channels). Then ``⟨R_i q, R_j k⟩ = ⟨q, R_{j−i} k⟩``: a dot-product score depends on positions
  only through ``j − i``. The rotation is applied to the ``q, k`` arguments of the attention module
  (a forward pre-hook), before any variant selects landmarks or computes scores, so every variant
  takes it unchanged; positions are ``0..n−1`` along the module's sequence axis (pads sit at the end, so a
  real token's position does not depend on the padding). A variant whose score is not a function of
  dot products (L1 distance: rotations are not L1 isometries) declares ``rotation_invariant = False``
  and is refused. No absolute embedding is added.
- ``none``: no positions (MEGA's LRA encoder, which has the EMA instead).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

AttentionFactory = Callable[..., nn.Module]


def frequencies(dim: int, base: float) -> torch.Tensor:
    """``base^(−2t/dim)`` for ``t = 0 .. dim/2 − 1`` (float64)."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


class LearnedPositions(nn.Embedding):
    """A trained absolute table ``(max_length, d_model)`` (an ``nn.Embedding``: ``model.embedding_init_std`` applies)."""

    def __init__(self, max_length: int, d_model: int):
        super().__init__(max_length, d_model)

    def add(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weight[: x.shape[-2]]

    def wrap(self, attention: AttentionFactory) -> AttentionFactory:
        return attention


class SinusoidalPositions(nn.Module):
    """The fixed sine/cosine table (module doc), a non-persistent buffer: no parameters, no state-dict keys."""

    def __init__(self, max_length: int, d_model: int, base: float = 10000.0):
        super().__init__()
        if d_model % 2:
            raise ValueError(f"model/positions=sinusoidal needs an even model.d_model, got {d_model}")
        angles = torch.arange(max_length, dtype=torch.float64)[:, None] * frequencies(d_model, base)
        table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # (max_length, d_model): sin, cos interleaved
        self.register_buffer("table", table.float(), persistent=False)

    def add(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table[: x.shape[-2]].to(x.dtype)

    def wrap(self, attention: AttentionFactory) -> AttentionFactory:
        return attention


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE of ``x`` ``(..., n, d)`` with ``cos, sin`` ``(n, d/2)``: pairs ``(x_t, x_{t+d/2})`` turned by their angle."""
    first, second = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class RotaryPositions(nn.Module):
    """RoPE on every attention module's ``q, k`` (module doc); ``base`` 10000 as in RoFormer."""

    def __init__(self, max_length: int, d_model: int, base: float = 10000.0):
        super().__init__()
        self.max_length = max_length
        self.base = base

    def add(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def wrap(self, attention: AttentionFactory) -> AttentionFactory:
        def build(num_heads: int, head_dim: int, **kwargs) -> nn.Module:
            module = attention(num_heads=num_heads, head_dim=head_dim, **kwargs)
            refuse_non_invariant(module)
            rotation = Rotation(self.max_length, head_dim, self.base)
            module.add_module("rotation", rotation)  # its buffers follow the module's device; no state-dict keys
            module.register_forward_pre_hook(rotation.hook)
            return module

        return build


class Rotation(nn.Module):
    """The ``cos, sin`` tables ``(max_length, head_dim/2)`` of one attention module and the hook that rotates its ``q, k``."""

    def __init__(self, max_length: int, head_dim: int, base: float):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"model/positions=rotary needs an even head size (model.d_model / model.num_heads), got {head_dim}")
        angles = torch.arange(max_length, dtype=torch.float64)[:, None] * frequencies(head_dim, base)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def hook(self, module: nn.Module, args: tuple) -> tuple:
        q, k, *rest = args
        n_q, n_k = q.shape[-2], k.shape[-2]
        return (rotate(q, self.cos[:n_q], self.sin[:n_q]), rotate(k, self.cos[:n_k], self.sin[:n_k]), *rest)


def refuse_non_invariant(module: nn.Module) -> None:
    """Stop with a clear error if a part of ``module`` scores by something other than dot products."""
    for part in module.modules():
        if getattr(part, "rotation_invariant", True) is False:
            raise ValueError(
                f"model/positions=rotary: {type(part).__name__} (in {type(module).__name__}) does not score by dot "
                "products, so rotary positions would not be relative (rotations do not preserve L1 distances); "
                "use model/positions=learned (or sinusoidal, none) with this attention"
            )


class NoPositions(nn.Module):
    """No position information."""

    def __init__(self, max_length: int, d_model: int):
        super().__init__()

    def add(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def wrap(self, attention: AttentionFactory) -> AttentionFactory:
        return attention
