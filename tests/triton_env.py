"""Where the Triton kernel tests run: on CUDA, or on the CPU when ``TRITON_INTERPRET=1`` was set before Triton was
imported (each kernel test file is then run by a subprocess test of the default suite)."""

from __future__ import annotations

import os

import pytest
import torch

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
KERNELS_RUN = INTERPRETER or torch.cuda.is_available()
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRETER else "cpu"


def needs_kernels(run_by: str) -> pytest.MarkDecorator:
    """Skip unless the kernels can run in this process; ``run_by`` names the test that runs them under the
    interpreter."""
    return pytest.mark.skipif(not KERNELS_RUN, reason=f"needs CUDA or TRITON_INTERPRET=1 at start-up; run by {run_by}")
