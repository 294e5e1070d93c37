"""The L1 kernels on the CPU (kernels/cpu/l1/l1.cpp) against their plain reference (kernels/cpu/l1/naive.py): the
distances, their sign gradients through :class:`kernels.cpu.l1.ops.L1Distance`, and the whole attention node
:class:`kernels.cpu.l1.ops.L1AttentionFunction` with padding, values and gradients in float32."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu.l1 import naive
from kernels.cpu.l1.ops import L1AttentionFunction, L1Distance, uses_kernel
from tests.tolerances import tolerance


def operands(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), requires_grad=True)


@pytest.mark.parametrize("a, b, d", [(1, 1, 1), (7, 13, 5), (33, 20, 24), (16, 64, 70)])
def test_distances_and_their_gradients_equal_the_reference(a, b, d):
    q, k = operands(2, 3, a, d), operands(2, 3, b, d, seed=1)
    assert uses_kernel(q)
    ours = L1Distance.apply(q, k, 0.5)
    expected = naive.distance(q.double(), k.double(), 0.5)
    torch.testing.assert_close(ours.double(), expected, **tolerance(torch.float32, d, scale=expected.abs().max().item()))
    grad = torch.randn(ours.shape, generator=torch.Generator().manual_seed(2))
    ours_q, ours_k = torch.autograd.grad(ours, (q, k), grad)
    expected_q, expected_k = torch.autograd.grad(expected, (q, k), grad.double())
    for mine, theirs, length in ((ours_q, expected_q, b), (ours_k, expected_k, a)):  # sums of ±0.5 g over keys/queries
        torch.testing.assert_close(mine.double(), theirs.double(), **tolerance(torch.float32, length, scale=grad.abs().sum().item()))


def test_attention_node_equals_the_reference_on_real_rows():
    """Softmax of −λ·L1/√d over real keys (two sequences, the second with 7 pads), values and gradients."""
    n, d = 20, 8
    q, k, v = operands(2, 2, n, d), operands(2, 2, n, d, seed=1), operands(2, 2, n, d, seed=2)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n - 7:] = False
    ours = L1AttentionFunction.apply(q, k, v, mask, 1.0)
    expected = naive.attention(q.double(), k.double(), v.double(), mask, lam=1.0)
    limits = tolerance(torch.float32, n * d, scale=v.abs().max().item())
    torch.testing.assert_close(ours.double(), expected, **limits)
    grad = torch.randn(ours.shape, generator=torch.Generator().manual_seed(3))
    for mine, theirs in zip(torch.autograd.grad(ours, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad.double())):
        torch.testing.assert_close(mine.double(), theirs.double(), **tolerance(torch.float32, n * d, scale=grad.abs().max().item() * n))
