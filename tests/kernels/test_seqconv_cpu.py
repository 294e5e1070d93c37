"""Nyström's sequence kernels on the CPU (kernels/seqconv/cpu.cpp) against their plain reference
(kernels/seqconv/naive.py): the masked depthwise conv (:class:`kernels.seqconv.cpu.ConvFunction`) with its
input, weight and base gradients, and the segment sums (:class:`kernels.seqconv.cpu.SegmentSums`)."""

from __future__ import annotations

import pytest
import torch

from kernels.seqconv import naive
from kernels.seqconv.cpu import ConvFunction, SegmentSums, uses_kernel
from tests.tolerances import tolerance

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


@pytest.mark.parametrize("n, size", [(1, 3), (17, 5), (40, 35)])
def test_masked_conv_and_its_gradients_equal_the_reference(n, size):
    generator = torch.Generator().manual_seed(n)
    x = torch.randn(2, 3, n, 8, generator=generator, requires_grad=True)
    weight = torch.randn(3, size, generator=generator, requires_grad=True)
    base = torch.randn(2, 3, n, 8, generator=generator, requires_grad=True)
    mask = torch.ones(2, n)
    mask[1, n // 2:] = 0
    assert uses_kernel(x)
    ours = ConvFunction.apply(x, weight, mask, base)
    expected = naive.conv(x.double(), weight.double(), in_mask=mask.double(), base=base.double())
    limits = tolerance(torch.float32, size, scale=x.abs().max().item() * weight.abs().max().item())
    torch.testing.assert_close(ours.double(), expected, **limits)
    grad = torch.randn(ours.shape, generator=generator)
    for mine, theirs, length in zip(torch.autograd.grad(ours, (x, weight, base), grad),
                                    torch.autograd.grad(expected, (x, weight, base), grad.double()),
                                    (size, 2 * n * 8, 1)):
        torch.testing.assert_close(mine.double(), theirs.double(), **tolerance(
            torch.float32, length, scale=grad.abs().max().item() * max(x.abs().max().item(), weight.abs().max().item())))


def test_segment_sums_and_their_gradient_equal_the_reference():
    """Segments of uneven size, a row left out (segment −1, a pad) and one beyond m."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 11, 4, generator=generator, requires_grad=True)
    segment = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3], [0, 1, 1, 1, 2, 2, 3, 3, 3, -1, 4]])
    ours = SegmentSums.apply(x, segment, 4)
    expected = naive.segment_sums(x.double(), segment, 4)
    torch.testing.assert_close(ours.double(), expected, **tolerance(torch.float32, 4, scale=x.abs().max().item()))
    grad = torch.randn(ours.shape, generator=generator)
    (mine,), (theirs,) = torch.autograd.grad(ours, (x,), grad), torch.autograd.grad(expected, (x,), grad.double())
    torch.testing.assert_close(mine, theirs, rtol=0, atol=0)  # each row takes its segment's gradient, 0 if left out
