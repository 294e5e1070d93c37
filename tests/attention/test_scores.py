"""The in-place row softmax of attention/scores.py against ``torch.softmax`` on a separate copy.

On CPU it runs ATen's softmax kernel with the output aliased to the input; elsewhere (and for
non-contiguous input) elementwise in-place ops. Both branches run here: a transposed view takes the
second one on CPU. Tolerances are relative and follow from the dtype, the row length and the logits'
spread (tests/tolerances.py), so they hold whatever order ATen's kernel sums in (ATEN_CPU_CAPABILITY).
"""

import pytest
import torch

from attention.scores import SoftmaxScore, masked_softmax, masked_softmax_out_of_place
from tests.tolerances import tolerance

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def reference(logits, key_mask):
    """Softmax of a copy in float64, masked keys at 0, rows without a real key all 0."""
    filled = logits.double().masked_fill(~key_mask, float("-inf"))
    return torch.softmax(filled, -1).nan_to_num(0.0)


def softmax_tolerance(logits, dtype=None):
    """exp(x − max) turns the rounding of x − max into a relative error |x − max|·u: the logits' spread is
    the softmax's condition number; the row sum adds λ·√n·u (accumulated in fp32 for bf16)."""
    dtype = dtype or logits.dtype
    spread = float(logits.max() - logits.min())
    accumulate = torch.float32 if dtype == torch.bfloat16 else dtype
    return tolerance(dtype, logits.shape[-1], accumulate=accumulate, conditioning=spread)


def logits_and_mask(width, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(2, 3, 5, width, generator=generator)).to(dtype)
    key_mask = torch.rand(2, 1, 1, width, generator=generator) > 0.3
    key_mask[1] = False  # the second sequence has no real key at all
    return logits, key_mask


@pytest.mark.parametrize("width", [1, 7, 64, 4097])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=["fp32", "fp64", "bf16"])
@pytest.mark.parametrize("contiguous", [True, False], ids=["aten_kernel", "elementwise"])
def test_matches_softmax_of_a_copy(width, dtype, contiguous):
    logits, key_mask = logits_and_mask(width, dtype)
    expected = reference(logits, key_mask)
    tol = softmax_tolerance(logits)  # fp32 at n = 4097: rtol 1.0e-5; fp64 1.9e-14
    if not contiguous:  # same values, transposed storage
        logits = logits.transpose(-1, -2).contiguous().transpose(-1, -2)
    weights = masked_softmax(logits, key_mask)
    assert weights.is_contiguous() == contiguous or width == 1
    torch.testing.assert_close(weights.double(), expected, **tol)  # atol 0: every weight to its relative bound
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
    # y ⊙ (g − Σ y ⊙ g): the sum errs by λ·√n·u·max|g| at most, the two branches each once.
    tol = softmax_tolerance(logits)
    rtol = 2 * tol["rtol"]
    torch.testing.assert_close(grads[0], grads[1], rtol=rtol, atol=rtol * float(upstream.abs().max()))


@pytest.mark.parametrize("width", [1, 64, 4097])
def test_out_of_place_form_matches_the_reference_and_its_gradient(width):
    """What compiled code runs (``masked_softmax_out_of_place``): the same weights, zero rows and gradient
    (float64 for the gradient check)."""
    logits, key_mask = logits_and_mask(width, torch.float32)
    weights = masked_softmax_out_of_place(logits, key_mask)
    torch.testing.assert_close(weights.double(), reference(logits, key_mask), **softmax_tolerance(logits))
    assert (weights[1] == 0).all() and (weights[0][..., ~key_mask[0, 0, 0]] == 0).all()
    small, small_mask = logits_and_mask(9, torch.float64, seed=1)
    small.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: masked_softmax_out_of_place(x, small_mask), (small,))


@pytest.mark.parametrize("fill", ["all_real", "every_row_real", "empty_rows"])
def test_cpu_skips_of_the_mask_steps_change_nothing(fill):
    """On CPU ``masked_softmax`` skips the mask bias when every key is real and the zeroing when every row has
    a real key; its weights equal the branch-free form's (what other devices and compiled code run)."""
    logits, key_mask = logits_and_mask(64, torch.float32, seed=4)
    if fill == "all_real":
        key_mask = torch.ones_like(key_mask)
    elif fill == "every_row_real":
        key_mask[1] = key_mask[0]
    weights = masked_softmax(logits.clone(), key_mask)
    torch.testing.assert_close(weights, masked_softmax_out_of_place(logits, key_mask), **softmax_tolerance(logits))
    torch.testing.assert_close(weights.double(), reference(logits, key_mask), **softmax_tolerance(logits))
    assert (weights[..., ~key_mask[0, 0, 0]][0] == 0).all()
    assert (weights[1] == 0).all() == (fill == "empty_rows")


def attend_inputs(a, b, dtype, seed=5):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, rows, 8, generator=generator, dtype=dtype) for rows in (a, b, b))
    masks = {
        "none": None,
        "per_sequence": torch.rand(2, 1, 1, b, generator=generator) > 0.3,  # as R V: pad keys of each sequence
        "per_head": torch.rand(2, 2, 1, b, generator=generator) > 0.3,  # as C W: landmark columns per head
    }
    masks["empty"] = masks["per_head"].clone()
    masks["empty"][1, 0] = False  # a sequence and head with no real key: its rows are 0
    return q, k, v, masks


@pytest.mark.parametrize("a, b", [(40, 6), (6, 40)], ids=["n_by_m", "m_by_n"])
@pytest.mark.parametrize("mask_kind", ["none", "per_sequence", "per_head", "empty"])
def test_softmax_attend_equals_weights_times_values(a, b, mask_kind):
    """``SoftmaxScore.attend`` (SDPA's fused CPU kernel) against the weights of ``SoftmaxScore`` times V: values
    in float32 (tolerance of a length-``b`` softmax and product) and float64, gradients by gradcheck."""
    for dtype in (torch.float32, torch.float64):
        q, k, v, masks = attend_inputs(a, b, dtype)
        mask = masks[mask_kind]
        fused = SoftmaxScore().attend(q, k, mask, v)
        exact = SoftmaxScore()(q.double(), k.double(), mask) @ v.double()
        logits = q.double() @ k.double().transpose(-1, -2) / 8**0.5
        spread = float(logits.max() - logits.min())  # softmax, then Σ w·v (terms of mixed sign: atol from |v|)
        tol = tolerance(dtype, b, scale=float(v.abs().max()), reductions=2, conditioning=spread)
        torch.testing.assert_close(fused.double(), exact, **tol)
        if mask_kind == "empty":
            assert (fused[1, 0] == 0).all()
    q, k, v, masks = attend_inputs(a, b, torch.float64, seed=6)
    mask = masks[mask_kind]
    inputs = tuple(x[:1, :, :5] if x is q else x[:1] for x in (q, k, v))
    mask = None if mask is None else mask[:1]
    leaves = tuple(x.clone().requires_grad_() for x in inputs)
    assert torch.autograd.gradcheck(lambda q, k, v: SoftmaxScore().attend(q, k, mask, v), leaves)
    fused_grads = torch.autograd.grad(SoftmaxScore().attend(*leaves[:2], mask, leaves[2]).square().sum(), leaves)
    exact_grads = torch.autograd.grad((SoftmaxScore()(*leaves[:2], mask) @ leaves[2]).square().sum(), leaves)
    for fused, exact in zip(fused_grads, exact_grads):
        torch.testing.assert_close(fused, exact, rtol=1e-10, atol=1e-12)
