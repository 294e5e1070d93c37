"""The pseudo-inverse's CPU kernel (kernels/pinv/cpu.cpp): its steps and their backward against the plain
PyTorch reference (kernels/pinv/naive.py) in float64, and where it runs."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attention import pinv
from kernels.pinv import cpu as pinv_cpu
from kernels.pinv import naive
from kernels.landmark_attention.cpu import vector_floats
from tests.tolerances import tolerance

WIDTH = vector_floats()
SIZES = sorted({WIDTH, 2 * WIDTH, 64, 128} - {m for m in (64, 128) if m % WIDTH})

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def problems(m: int, count: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, Z₀)`` float32 ``(count, m, m)``: softmax matrices (CUR's and Nyström's ``U``), one with CUR's identity
    rows on invalid landmarks, and ``Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞)`` as :func:`attention.pinv.iterative_pinv` starts."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.softmax(2 * torch.randn(count, m, m, generator=generator), -1)
    a[-1, m // 2:] = torch.eye(m)[m // 2:]
    norm = a.abs().sum(-2).amax(-1) * a.abs().sum(-1).amax(-1)
    return a, a.mT / norm[:, None, None]


@pytest.mark.parametrize("m", SIZES)
@pytest.mark.parametrize("n_iter", [1, 6])
def test_steps_and_backward_match_the_pytorch_form_in_float64(m, n_iter):
    a, z = problems(m)
    assert pinv_cpu.takes(a)
    out, saved = pinv_cpu.iterate(a, z, n_iter, keep=True)
    expected, steps = naive.steps(a.double(), z.double(), n_iter)
    limits = tolerance(torch.float32, m, reductions=4 * n_iter, scale=expected.abs().amax().item())
    torch.testing.assert_close(out.double(), expected, **limits)
    torch.testing.assert_close(pinv_cpu.iterate(a, z, n_iter, keep=False)[0], out, rtol=0, atol=0)
    assert saved.shape == (3, n_iter, pinv_cpu.STEP_MATRICES, m, m)
    for t, step in enumerate(steps):  # (Z, AZ, W, inner, S) of every step
        for ours, theirs in zip(saved[:, t].unbind(1), step):
            torch.testing.assert_close(ours.double(), theirs, **tolerance(
                torch.float32, m, reductions=4 * (t + 1), scale=theirs.abs().amax().item()))
    grad = torch.randn(3, m, m, generator=torch.Generator().manual_seed(1))
    grad_a, grad_z = pinv_cpu.iterate_backward(a, saved, grad)
    reference = [x.double().requires_grad_() for x in (a, z)]
    expected_a, expected_z = torch.autograd.grad(naive.steps(*reference, n_iter)[0], reference, grad.double())
    for ours, theirs in ((grad_a, expected_a), (grad_z, expected_z)):
        torch.testing.assert_close(ours.double(), theirs, **tolerance(
            torch.float32, m, reductions=12 * n_iter, scale=theirs.abs().amax().item()))


def test_iterative_pinv_runs_the_kernel_forward_and_backward(monkeypatch):
    """float32 CPU: the kernel, with and without gradients, giving the PyTorch form's values and gradients (on
    matrices without tied norms: softmax rows all sum to 1, so ‖A‖∞'s gradient would pick a row by rounding)."""
    calls = []
    for name in ("iterate", "iterate_backward"):
        function = getattr(pinv_cpu, name)
        def spy(*args, name=name, function=function, **options):
            calls.append(name)
            return function(*args, **options)
        monkeypatch.setattr(pinv_cpu, name, spy)
    generator = torch.Generator().manual_seed(2)
    a = (torch.eye(64) + torch.randn(3, 1, 64, 64, generator=generator) / 16).requires_grad_()
    z = pinv.iterative_pinv(a, 6)
    z.backward(torch.ones_like(z))
    with torch.no_grad():
        pinv.iterative_pinv(a, 6)
    assert calls == ["iterate", "iterate_backward", "iterate"]
    reference = a.detach().double().requires_grad_()
    expected = pinv.iterative_pinv(reference, 6)
    expected.backward(torch.ones_like(expected))
    limits = tolerance(torch.float32, 64, reductions=24, scale=expected.abs().amax().item())
    torch.testing.assert_close(z.double(), expected, **limits)
    torch.testing.assert_close(a.grad.double(), reference.grad, **tolerance(
        torch.float32, 64, reductions=72, scale=reference.grad.abs().amax().item()))


def test_pytorch_form_where_the_kernel_does_not_apply():
    """Sizes other than a power of two times the vector width, float64 and FLOP counting run the PyTorch form."""
    assert not pinv_cpu.takes(torch.zeros(2, 3 * WIDTH, 3 * WIDTH))
    assert not pinv_cpu.takes(torch.zeros(2, 64, 64, dtype=torch.float64))
    assert not pinv_cpu.takes(torch.zeros(2, 256, 256))
    a = problems(64)[0]
    with FlopCounterMode(display=False) as counter:
        pinv.iterative_pinv(a, 6)
    assert counter.get_total_flops() == 6 * 4 * 3 * 2 * 64**3  # four m × m products per step
