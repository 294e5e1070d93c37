"""models.dropout.Dropout and its custom op ``lra::dropout`` (kernels/dropout/): the kernel against its plain
PyTorch reference (`kernels.dropout.naive`, bit for bit), its mask (rate, scale, backward, seeds, threads,
independence) against what nn.Dropout promises, and the paths that are not the kernel (eval, p = 0 and 1, other
dtypes, no compiler)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from kernels.common import build
from kernels.dropout import naive
from kernels.dropout import cpu as dropout_kernel
from kernels.dropout.cpu import dropout
from models.dropout import Dropout

SIGMAS = 5  # binomial / correlation tolerances: 5 standard deviations


def keep_fraction_bounds(n: int, p: float) -> tuple[float, float]:
    sigma = math.sqrt(p * (1 - p) / n)
    return 1 - p - SIGMAS * sigma, 1 - p + SIGMAS * sigma


def nonzero(*shape, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    """Values in ±[0.5, 1.5): no zeros, so the output's zeros are the dropped elements."""
    g = torch.Generator().manual_seed(seed)
    magnitude = 0.5 + torch.rand(*shape, generator=g, dtype=torch.float64)
    sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
    return (magnitude * sign).to(dtype)


def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize(("seed", "p"), [(0, 0.5), (-4_242_424_242_424, 0.1), (2**63 - 1, 0.9), (12345, 1 / 3)])
def test_the_kernel_is_its_plain_pytorch_reference_bit_for_bit(dtype, seed, p):
    """The kernel's hash, threshold and scaling, written in int64 tensor arithmetic (kernels.dropout.naive)."""
    x = nonzero(70_001, dtype=dtype, seed=1)
    assert torch.equal(dropout(x, torch.tensor(seed), p), naive.dropout(x, seed, p))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_kept_fraction_is_one_minus_p_and_kept_values_are_x_over_one_minus_p(p):
    x = nonzero(200_000)
    torch.manual_seed(0)
    y = Dropout(p).train()(x)
    kept = y != 0
    low, high = keep_fraction_bounds(x.numel(), p)
    assert low <= kept.double().mean() <= high
    assert torch.equal(y[kept], x[kept] / (1 - p))
    assert not torch.equal(y, x / (1 - p)) and not torch.equal(y, torch.zeros_like(y))


def test_float64_and_bfloat16():
    p = 0.25
    for dtype, reference in ((torch.float64, lambda x: x / (1 - p)),
                             (torch.bfloat16, lambda x: (x.float() / (1 - p)).bfloat16())):  # float maths, rounded
        x = nonzero(100_000, dtype=dtype)
        torch.manual_seed(0)
        y = Dropout(p).train()(x)
        assert y.dtype == dtype
        kept = y != 0
        low, high = keep_fraction_bounds(x.numel(), p)
        assert low <= kept.double().mean() <= high, dtype
        assert torch.equal(y[kept], reference(x[kept])), dtype


def test_backward_applies_the_forward_mask():
    p = 0.3
    x = nonzero(3, 50, 70).requires_grad_()
    grad = nonzero(3, 50, 70, seed=1)
    torch.manual_seed(0)
    y = Dropout(p).train()(x)
    y.backward(grad)
    kept = y.detach() != 0
    assert torch.equal(x.grad, grad * kept / (1 - p))


def test_non_contiguous_input_and_gradient():
    """A transposed input is masked in its logical (contiguous) order; its gradient may be non-contiguous too."""
    p = 0.3
    x = nonzero(40, 30).t().requires_grad_()
    torch.manual_seed(0)
    y = Dropout(p).train()(x)
    torch.manual_seed(0)
    assert torch.equal(y, Dropout(p).train()(x.detach().contiguous()))
    grad = nonzero(40, 30, seed=1).t()
    y.backward(grad)
    assert torch.equal(x.grad, grad * (y.detach() != 0) / (1 - p))


def test_gradcheck_float64():
    x = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    seed = torch.tensor(12345)
    assert torch.autograd.gradcheck(lambda t: dropout(t, seed, 0.4), (x,))
    assert torch.autograd.gradgradcheck(lambda t: dropout(t, seed, 0.4), (x,))


def test_the_custom_op_registration():
    """Schema, fake (meta) function and autograd formula agree with the kernel (what torch.compile relies on;
    opcheck's AOT-dispatch check, 20 s, is left to tests/runtime/test_compile.py's compiled training steps)."""
    torch.library.opcheck(dropout, (torch.randn(5, 7, requires_grad=True), torch.tensor(3), 0.2),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_only_the_seed_is_saved_for_backward():
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    x = torch.randn(64, 1000, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        Dropout(0.1).train()(x)
    assert saved == [8]


def test_same_seed_same_mask_and_consecutive_calls_differ():
    x = nonzero(10_000)
    module = Dropout(0.5).train()
    torch.manual_seed(7)
    first, second = module(x), module(x)
    torch.manual_seed(7)
    assert torch.equal(module(x), first)
    assert not torch.equal(first, second)
    torch.manual_seed(8)
    assert not torch.equal(module(x), first)


def test_the_mask_depends_on_seed_and_index_only():
    """Any thread count (the kernel splits above 65,536 elements per thread) and any tensor size: element i's
    decision is hash(seed, i), so a shorter tensor's mask is the prefix of a longer one's."""
    x = nonzero(300_001)
    seed = torch.tensor(-4_242_424_242_424)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = dropout(x, seed, 0.5)
        torch.set_num_threads(2)
        two = dropout(x, seed, 0.5)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    assert torch.equal(dropout(x[:1000], seed, 0.5), one[:1000])


def test_no_correlation_between_neighbours_or_consecutive_seeds():
    n = 400_000
    x = torch.ones(n)
    tolerance = SIGMAS / math.sqrt(n)  # the sample correlation of independent masks is ~N(0, 1/n)
    masks = [dropout(x, torch.tensor(seed), 0.5) != 0 for seed in (0, 1, 2**32, 2**32 + 1)]
    for mask in masks:
        for lag in (1, 2, 7, 64):
            assert abs(correlation(mask[:-lag], mask[lag:])) < tolerance, lag
    for a in range(len(masks)):
        for b in range(a + 1, len(masks)):
            assert abs(correlation(masks[a], masks[b])) < tolerance, (a, b)


def test_eval_mode_and_p_zero_are_the_identity_and_p_one_gives_zeros():
    x = nonzero(100)
    assert Dropout(0.5).eval()(x) is x
    assert Dropout(0.0).train()(x) is x
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))


def test_same_module_as_nn_dropout_to_a_checkpoint():
    module = Dropout(0.1)
    assert isinstance(module, torch.nn.Dropout) and module.state_dict() == {} and repr(module) == repr(
        torch.nn.Dropout(0.1))


def test_other_dtypes_go_to_f_dropout():
    x = nonzero(1000, dtype=torch.float16)
    torch.manual_seed(3)
    y = Dropout(0.5).train()(x)
    torch.manual_seed(3)
    assert torch.equal(y, F.dropout(x, 0.5, training=True))


def test_without_a_compiler_it_warns_once_and_runs_f_dropout(monkeypatch):
    def no_compiler(*args, **kwargs):
        raise RuntimeError("the C++ compiler 'c++' was not found on PATH")

    dropout_kernel.library.cache_clear()
    monkeypatch.setattr(build, "build", no_compiler)
    try:
        x = nonzero(1000)
        with pytest.warns(UserWarning, match="F.dropout"):
            torch.manual_seed(3)
            y = Dropout(0.5).train()(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            Dropout(0.5).train()(x)
        torch.manual_seed(3)
        assert torch.equal(y, F.dropout(x, 0.5, training=True))
    finally:
        dropout_kernel.library.cache_clear()
