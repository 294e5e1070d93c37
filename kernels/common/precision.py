"""Autocast off for the float32 regions of the attention maths and their kernels' autograd formulas
(docs/design.md §1 "Numerical precision").

Pseudo-inverses, CUR/Nyström matrices, L1 distances, the delta-rule solve and MEGA's FFT run in float32
with autocast disabled. ``torch.autocast`` refuses device types that have no autocast at all (``meta``:
shapes without values, which tests/runtime/test_device_hygiene.py uses to catch host syncs), so those get a null
context: with no autocast there is nothing to disable. (Here, below :mod:`attention`, so that the kernels'
autograd formulas use it too.)
"""

from __future__ import annotations

import contextlib

import torch


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """``torch.autocast(device_type, enabled=False)``, or a null context where ``device_type`` has no autocast."""
    # torch.compile runs on devices that have autocast, and some versions' Dynamo cannot trace the availability
    # query (torch 2.11 broke the graph there once per float32 region on CUDA)
    if torch.compiler.is_compiling() or torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()
