"""``python -m lra.bench.gpu_check``'s FlashL1 check (``lra/bench/gpu_check_l1.py``): the parts that run without a GPU.

The rest of gpu_check (plan, arguments, report, the one-line failure without CUDA) is tested in
``tests/kernels/test_aot_compile.py``.
"""

from __future__ import annotations

import pytest
import torch

from lra.bench import gpu_check, gpu_check_l1
from tests.conftest import run_cli
from kernels.l1.naive import dense_l1


@pytest.mark.process
def test_kernels_step_covers_flashl1_shapes():
    """The ``kernels`` step names the FlashL1 check and its shapes: n odd and even, padded keys, an all-pad
    sequence, head_dim up to 128; ``--dry-run`` prints it."""
    (step,) = gpu_check.plan(gpu_check.parse_args(["--only", "kernels"]))
    assert step.command is None and "FlashCUR vs CUR" in step.title and "FlashL1 vs PyTorch L1" in step.title
    shapes = gpu_check_l1.L1_SHAPES
    assert all(f"({n}, {d})" in step.title for n, d, *_ in shapes)
    assert {n % 2 for n, *_ in shapes} == {0, 1} and {d for _, d, *_ in shapes} >= {16, 32, 64, 128}
    assert any(0 < min(lengths) < n for n, _, lengths, _ in shapes) and any(0 in lengths for _, _, lengths, _ in shapes)
    dry = run_cli(["-m", "lra.bench.gpu_check", "--dry-run", "--only", "kernels"])
    assert dry.returncode == 0 and "FlashL1 vs PyTorch L1" in dry.stdout, dry.stdout + dry.stderr


@pytest.mark.parametrize("n, d, lengths, lam", [(17, 16, (17, 9), 1.0), (8, 24, (8, 0), 3.0)])
def test_reference_l1_is_eq1(n, d, lengths, lam):
    """The reference the GPU check compares FlashL1 with: eq. 1 (float64 formula of kernels/l1/naive.py),
    forward and gradients, an all-pad sequence giving 0."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, d, generator=generator, requires_grad=True) for _ in range(3))
    mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    out = gpu_check_l1.reference_l1(q, k, v, mask, lam)
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = dense_l1(*leaves, mask, lam)
    assert out.dtype == torch.float32 and torch.allclose(out.double(), ref, atol=1e-5)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), leaves)
    assert all(torch.allclose(g.double(), r, atol=1e-4) for g, r in zip(grads, ref_grads))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_flashl1_check_without_cuda_says_so():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        gpu_check_l1.flashl1_checks()


def test_kernel_checks_run_both_and_raise_at_the_end(monkeypatch):
    """Both tables in the step's details; a failing FlashCUR check does not hide the FlashL1 rows."""
    monkeypatch.setattr(gpu_check, "flashcur_checks", lambda: ["| cur |"])
    monkeypatch.setattr(gpu_check, "flashl1_checks", lambda: ["| l1 |"])
    assert gpu_check.kernel_checks() == ["| cur |", "", "| l1 |"]

    def off():
        raise AssertionError("FlashCUR differs from CUR")

    monkeypatch.setattr(gpu_check, "flashcur_checks", off)
    step = gpu_check.Step("kernels", "kernels")
    gpu_check.run_step(step)
    assert step.status == "failed (AssertionError)"
    assert "FlashCUR differs from CUR" in step.details and "| l1 |" in step.details
