"""Plain PyTorch reference of the dropout kernel (:mod:`kernels.dropout.cpu`): the same splitmix64 hash in int64
tensor arithmetic (wrapping products, logical right shifts by masking), the same threshold and the same scaling in the
kernel's compute type, so tests/kernels/test_dropout.py can compare the kernel bit for bit.

``keep_i = [hash(seed, i) ≥ round(p · 2³²)]``, ``hash(seed, i)`` the upper 32 bits of
``mix(mix(seed) + i · 0x9E3779B97F4A7C15)``; ``y_i = x_i · keep_i / (1 − p)`` in float64 for float64 and in float32
for float32 and bfloat16 (rounded back to nearest even).
"""

from __future__ import annotations

import math

import torch

GOLDEN, MIX_1, MIX_2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(value: int) -> int:
    """``value`` mod 2⁶⁴ as the int64 of the same bits."""
    value %= 2**64
    return value - 2**64 if value >= 2**63 else value


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """The logical right shift of int64 ``z`` as uint64 bits (``>>`` on int64 is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's output function on int64 ``z`` (products wrap modulo 2⁶⁴, as uint64 products do)."""
    z = (z ^ _shift_right(z, 30)) * _signed(MIX_1)
    z = (z ^ _shift_right(z, 27)) * _signed(MIX_2)
    return z ^ _shift_right(z, 31)


def keep(n: int, seed: int, p: float) -> torch.Tensor:
    """The kernel's decisions (bool ``(n,)``) for flat indices ``0 .. n − 1``, a 64-bit ``seed`` and rate ``p``."""
    key = _mix(torch.tensor(_signed(seed), dtype=torch.int64))
    index = torch.arange(n, dtype=torch.int64)
    threshold = min(math.floor(p * 4294967296.0 + 0.5), 4294967295)  # llround of a non-negative value
    return _shift_right(_mix(key + index * _signed(GOLDEN)), 32) >= threshold


def dropout(x: torch.Tensor, seed: int, p: float) -> torch.Tensor:
    """``x · keep / (1 − p)`` (contiguous, ``x``'s shape and dtype) for a float32, float64 or bfloat16 ``x``."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    factor = keep(x.numel(), seed, p).to(compute).view(x.shape)
    return (x.to(compute) * factor / torch.tensor(1.0 - p, dtype=compute)).to(x.dtype)
