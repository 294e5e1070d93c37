"""Where the Triton kernel tests run: on CUDA, or on the CPU when ``TRITON_INTERPRET=1`` was set before Triton was
imported (each kernel test file is then run by a subprocess test of the default suite)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
KERNELS_RUN = INTERPRETER or torch.cuda.is_available()
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRETER else "cpu"


def needs_kernels(run_by: str) -> pytest.MarkDecorator:
    """Skip unless the kernels can run in this process; ``run_by`` names the test that runs them under the
    interpreter."""
    return pytest.mark.skipif(not KERNELS_RUN, reason=f"needs CUDA or TRITON_INTERPRET=1 at start-up; run by {run_by}")


def _tf32(x: np.ndarray) -> np.ndarray:
    """float32 rounded to TF32 (10 explicit mantissa bits, to nearest), as a tensor core reads a float32 operand;
    inf and nan pass unchanged."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    rounded = (bits + np.uint32(0xFFF) + ((bits >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    return np.where(special, bits, rounded).view(np.float32)


def hardware_dot(a: np.ndarray, b: np.ndarray, precision: str) -> np.ndarray:
    """``a @ b`` for float32 operands as an NVIDIA GPU forms a ``tl.dot`` of that ``input_precision``: ``IEEE`` on the
    FMA units (exact float32 products), ``TF32`` on the tensor cores (operands rounded to TF32), ``TF32x3`` as
    Triton lowers it (each operand split ``x = big + small``, both TF32, and ``small·big + big·small + big·big``
    summed: ~22 mantissa bits, the ``small·small`` term dropped)."""
    if precision == "IEEE":
        return np.matmul(a, b)
    a_big, b_big = _tf32(a), _tf32(b)
    if precision == "TF32":
        return np.matmul(a_big, b_big)
    if precision == "TF32x3":
        a_small, b_small = _tf32(a - a_big), _tf32(b - b_big)
        return np.matmul(a_small, b_big) + np.matmul(a_big, b_small) + np.matmul(a_big, b_big)
    raise ValueError(f"no emulation of input_precision {precision}")

