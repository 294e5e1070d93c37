"""The in-place row softmax of attention/scores.py against ``torch.softmax`` on a separate copy.

On CPU it runs ATen's softmax kernel with the output aliased to the input; elsewhere (and for
non-contiguous input) elementwise in-place ops. Both branches run here: a transposed view takes the
second one on CPU.
"""

import pytest
import torch

from attention.scores import masked_softmax


def reference(logits, key_mask):
    """Softmax of a copy, masked keys at 0, rows without a real key all 0."""
    filled = logits.double().masked_fill(~key_mask, float("-inf"))
    weights = torch.softmax(filled, -1).nan_to_num(0.0)
    return weights.to(logits.dtype)


def logits_and_mask(width, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(2, 3, 5, width, generator=generator)).to(dtype)
    key_mask = torch.rand(2, 1, 1, width, generator=generator) > 0.3
    key_mask[1] = False  # the second sequence has no real key at all
    return logits, key_mask


@pytest.mark.parametrize("width", [1, 7, 64, 4097])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12), (torch.bfloat16, 8e-3)])
@pytest.mark.parametrize("contiguous", [True, False], ids=["aten_kernel", "elementwise"])
def test_matches_softmax_of_a_copy(width, dtype, tol, contiguous):
    logits, key_mask = logits_and_mask(width, dtype)
    expected = reference(logits, key_mask)
    if not contiguous:  # same values, transposed storage
        logits = logits.transpose(-1, -2).contiguous().transpose(-1, -2)
    weights = masked_softmax(logits, key_mask)
    assert weights.is_contiguous() == contiguous or width == 1
    torch.testing.assert_close(weights, expected, atol=tol, rtol=0)
    assert (weights[1] == 0).all() and (weights[0][..., ~key_mask[0, 0, 0]] == 0).all()


@pytest.mark.parametrize("contiguous", [True, False], ids=["aten_kernel", "elementwise"])
def test_gradient_matches_finite_differences(contiguous):
    logits, key_mask = logits_and_mask(9, torch.float64, seed=1)
    key_mask[1] = True
    if not contiguous:
        logits = logits.transpose(-1, -2).contiguous().transpose(-1, -2)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: masked_softmax(x.clone(), key_mask), (logits,))


def test_gradient_of_both_branches_agrees_in_float32():
    logits, key_mask = logits_and_mask(300, torch.float32, seed=2)
    upstream = torch.randn(logits.shape, generator=torch.Generator().manual_seed(3))
    grads = []
    for source in (logits, logits.transpose(-1, -2).contiguous().transpose(-1, -2)):
        leaf = source.clone().requires_grad_(True)
        (masked_softmax(leaf * 1.0, key_mask) * upstream).sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)
