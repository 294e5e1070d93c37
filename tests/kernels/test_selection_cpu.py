"""CUR's selection priorities on the CPU (kernels/selection/cpu.cpp) against their plain reference
(kernels/selection/naive.py); the top indices are checked against the method's PyTorch form in
tests/attention/test_selection.py."""

from __future__ import annotations

import pytest
import torch

from kernels.selection import naive
from kernels.selection.cpu import abs_row_sums
from tests.tolerances import tolerance

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


@pytest.mark.parametrize("n, d", [(1, 1), (37, 20), (64, 32)])
def test_abs_row_sums_equal_the_reference(n, d):
    x = torch.randn(2, 3, d, n, generator=torch.Generator().manual_seed(n)).transpose(-1, -2)  # strided rows too
    for operand in (x, x.contiguous()):
        expected = naive.abs_row_sums(operand)
        torch.testing.assert_close(abs_row_sums(operand).double(), expected,
                                   **tolerance(torch.float32, d, scale=expected.abs().max().item()))
