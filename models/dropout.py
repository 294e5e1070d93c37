"""Dropout whose CPU mask is a hash of (seed, index): one fused pass, regenerated in backward.

:class:`Dropout` is a drop-in for ``nn.Dropout`` (a subclass: same ``p``, same empty state dict, so
checkpoints load unchanged). In training mode with ``0 < p < 1`` on a CPU float32, float64 or bfloat16
tensor it computes, in one pass of the custom op ``lra::dropout`` (:func:`kernels.dropout.cpu.dropout`)::

    y_i = x_i · keep_i / (1 − p),   keep_i = [ hash(seed, i) ≥ p · 2³² ],   i = flat index of x (contiguous)

The decision depends on ``(seed, i)`` only, so it is the same for any ``torch.get_num_threads()`` and any
chunking. The 64-bit seed is drawn from torch's default CPU generator on every call
(``torch.randint``), so ``torch.manual_seed`` and the RNG state our checkpoints save keep runs
reproducible, and consecutive calls draw different masks. Backward is the same kernel on the gradient
with the same seed (``∂x = g · keep / (1 − p)``): only the seed (8 bytes) is saved for backward, not a
mask of the input's size. Kept values are exactly ``x / (1 − p)`` (``1 − p`` rounded to float for
float32 and bfloat16); dropped ones are ``x · 0`` (NaN stays NaN, as with ``nn.Dropout``).

The kernel is the custom op ``lra::dropout`` (``torch.library.custom_op`` with a fake and an autograd
formula, beside the kernel in kernels/dropout/), so ``torch.compile`` keeps one graph and calls the
same kernel: with ``fallback_random`` (``lra.module.compile_in_place`` on CPU) the seeds come from ATen's
generator in the same order, and a compiled step sees the eager step's masks.

Device dispatch (:func:`kernels.dropout.cpu.takes`), not a fallback: eval mode and ``p = 0`` are the
identity, ``p = 1`` and tensors on other devices (CUDA) or of other dtypes go to ``F.dropout`` exactly as
``nn.Dropout`` does. Without a C++ compiler (the kernel is built on first use by :mod:`kernels.common.build`)
it warns once and uses ``F.dropout`` on CPU too.
Measured: docs/bench.md, "Dropout on CPU".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.dropout.cpu import dropout, takes

SEED_LOW, SEED_HIGH = -(2**63), 2**63 - 1  # torch.randint's range: (almost) every 64-bit seed


class Dropout(nn.Dropout):
    """``nn.Dropout(p)`` with the fused, hash-masked CPU kernel in training (module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if not takes(x, self.p):
            return F.dropout(x, self.p, training=True)
        seed = torch.randint(SEED_LOW, SEED_HIGH, (), dtype=torch.int64)  # torch's default CPU generator
        return dropout(x, seed, self.p)
