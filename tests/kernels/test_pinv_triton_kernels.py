"""The fused pseudo-inverse kernels (:mod:`kernels.pinv`) against the float64 reference of :mod:`kernels.pinv.naive`.

These tests need the kernels to run: on a CUDA GPU, or on CPU with ``TRITON_INTERPRET=1`` set before Python
starts (the interpreter is chosen when :mod:`kernels.pinv` is defined). Without either they are skipped here,
and ``tests/kernels/test_pinv_triton.py::test_kernels_under_the_interpreter`` runs this file in a subprocess with the
variable set. Shapes are small (m ≤ 64, the kernels' largest, three problems): the interpreter is slow; the default suite runs
a padded tile and the largest size, the ``slow`` cases the others (``test_pinv_triton.py`` runs both selections).

Tolerances: a float32 product of length m rounds by at most about ``m·u`` relative to its operands (``u = 2⁻²⁴``)
and the Newton–Schulz iteration does not amplify it on these well-scaled inputs, so the kernels must agree with
the float64 reference to ``4·m·u`` of the largest entry (forward, and ``∂A`` likewise; the PyTorch form in float32
lands within the same bound).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from attention.pinv import pytorch_pinv
from kernels.pinv import forward
from kernels.pinv.naive import reference_pinv
from kernels.pinv.ops import fused_pinv, pinv_forward, start_norm
from tests.triton_env import DEVICE, needs_kernels

pytestmark = [needs_kernels("test_pinv_triton.py::test_kernels_under_the_interpreter"),
              pytest.mark.usefixtures("exact_float32_matmuls", "tensor_core_dots")]
UNIT = 2.0**-24  # float32 unit roundoff
# full 16 × 16, 32 × 32 and 64 × 64 tiles (products as one, two and four dots of K = 16), zero-padded ones (7, 20);
# the default suite runs a padded 16-tile and the largest, ``slow`` (make test-slow) the rest (:func:`sized`)
SLOW = pytest.mark.slow


def tolerance(m: int, reference: torch.Tensor) -> float:
    return 4 * m * UNIT * reference.abs().max().item()


def matrices(kind: str, m: int, problems: int = 3, seed: int = 0) -> torch.Tensor:
    """``(problems, m, m)`` float32 on the test device: ``well`` (I + noise), ``scaled`` (norms 10⁻³, 1, 10³:
    ``global`` then starts far from A⁺ for two of them), ``logits`` (for softmax matrices, CUR's U)."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(problems, m, m, generator=generator)
    if kind == "well":
        a = torch.eye(m) + 0.3 * noise / m**0.5
    elif kind == "scaled":
        a = (noise + 3 * torch.eye(m)) * torch.logspace(-3, 3, problems)[:, None, None]
    else:
        a = 2 * noise
    return a.to(DEVICE)


def fused(a: torch.Tensor, n_iter: int, init: str) -> torch.Tensor:
    """:func:`attention.pinv.iterative_pinv`'s fused branch (that function takes it on CUDA only)."""
    return fused_pinv(a, n_iter, start_norm(a, init) if init == "global" else None)


def reference(a: torch.Tensor, n_iter: int, init: str) -> torch.Tensor:
    return reference_pinv(a, n_iter, init)


def sized(sizes, inits=("per_head", "global")):
    """``(m, init)`` cases: every one ``slow`` but the padded 7 (both inits) and the largest 64 (per_head)."""
    return [pytest.param(m, init, marks=() if m == 7 or (m == 64 and init == "per_head") else SLOW)
            for m in sizes for init in inits]


@pytest.mark.parametrize("m, init", sized((7, 64, 16, 20, 32)))
@pytest.mark.parametrize("n_iter", [pytest.param(1, marks=SLOW), 6])
def test_forward_matches_the_float64_reference(m, init, n_iter):
    for a in (matrices("well", m), matrices("scaled", m), torch.softmax(matrices("logits", m), -1)):
        expected = reference(a, n_iter, init)
        z = fused(a, n_iter, init)
        assert z.dtype == torch.float32 and z.shape == a.shape
        error = (z.double() - expected).abs().max().item()
        assert error <= tolerance(m, expected), (m, init, n_iter, error / (m * UNIT * expected.abs().max().item()))


@pytest.mark.parametrize("m, init", sized((7, 32, 64)))
def test_gradient_matches_float64_autograd(m, init):
    """``∂A`` through all steps and ``Z₀``'s norms (not detached) vs autograd through the float64 reference,
    on matrices whose maximal row and column sums are unique (ties: next test). Three steps: the backward's first,
    middle (a saved iterate) and last (``Z₀`` recomputed) steps, at a third of the interpreter's time of six (the
    next test runs six)."""
    for kind in ("well", "scaled"):
        a = matrices(kind, m, seed=1)
        grad_z = torch.randn(a.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
        a32, a64 = a.clone().requires_grad_(), a.double().requires_grad_()
        (grad,) = torch.autograd.grad(fused(a32, 3, init), a32, grad_z)
        (expected,) = torch.autograd.grad(reference(a64, 3, init), a64, grad_z.double())
        error = (grad.double() - expected).abs().max().item()
        assert error <= tolerance(m, expected), (kind, error / (m * UNIT * expected.abs().max().item()))


@pytest.mark.parametrize("init", ["per_head", pytest.param("global", marks=SLOW)])
def test_gradient_through_softmax_with_tied_row_sums(init):
    """CUR's ``U`` is a row softmax (row sums all 1, so which row attains ``‖A‖∞`` is a rounding tie) with identity
    rows on invalid slots. Through the softmax the tie's share of the norm gradient cancels (a row-constant
    gradient has no softmax gradient), so ``∂logits`` agrees whichever tied row each form picked."""
    m = 20
    logits = matrices("logits", m, seed=3)
    invalid = torch.zeros(3, m, 1, dtype=torch.bool, device=DEVICE)
    invalid[1, 15:] = True
    eye = torch.eye(m, device=DEVICE).expand(3, m, m)
    grad_z = torch.randn(3, m, m, generator=torch.Generator().manual_seed(4)).to(DEVICE)

    def grad_of(form, x):
        x = x.clone().requires_grad_()
        u = torch.where(invalid, eye.to(x.dtype), torch.softmax(x, -1))
        return torch.autograd.grad(form(u, 6, init), x, grad_z.to(x.dtype))[0]

    expected = grad_of(reference, logits.double())
    error = (grad_of(fused, logits).double() - expected).abs().max().item()
    assert error <= tolerance(m, expected), error


@pytest.mark.parametrize("init", ["per_head", pytest.param("global", marks=SLOW)])
def test_directional_derivatives_match_central_differences(init):
    """gradcheck's idea without its float64 requirement: ``⟨∂A, V⟩`` of ``L = ⟨G, Z(A)⟩`` from the float32 kernel
    against ``(L(A + hV) − L(A − hV)) / 2h`` of the float64 reference, for random directions and for one that
    moves only the row and the column attaining ``‖A‖∞`` and ``‖A‖₁`` (the norms' gradient alone)."""
    m = 16
    a = matrices("scaled", m, seed=5)
    generator = torch.Generator().manual_seed(6)
    grad_z = torch.randn(a.shape, generator=generator).double().to(DEVICE)
    a32 = a.clone().requires_grad_()
    (grad,) = torch.autograd.grad(fused(a32, 4, init), a32, grad_z.float())
    top = torch.zeros_like(a)
    rows, cols = a.abs().sum(-1).argmax(-1), a.abs().sum(-2).argmax(-1)
    for p in range(a.shape[0]):
        top[p, rows[p], :] = a[p, rows[p], :].sign()
        top[p, :, cols[p]] = a[p, :, cols[p]].sign()
    directions = [torch.randn(a.shape, generator=generator).to(DEVICE) for _ in range(3)] + [top]
    step = 1e-6
    loss = lambda x: (reference(x, 4, init) * grad_z).sum().item()  # noqa: E731
    for direction in directions:
        v = direction.double()
        numeric = (loss(a.double() + step * v) - loss(a.double() - step * v)) / (2 * step)
        analytic = (grad.double() * v).sum().item()
        scale = (grad.double() * v).abs().sum().item()
        assert abs(analytic - numeric) <= 4 * m * UNIT * scale + 1e-6 * abs(numeric), (analytic, numeric)


def test_zero_and_rank_deficient_matrices():
    """An all-zero matrix: Z = 0, and ∂A = Gᵀ / tiny (the clamped norm; ±inf) exactly as the PyTorch form's
    autograd gives; a rank-4 matrix stays finite and as close to the float64 form as the float32 PyTorch form."""
    m = 16
    generator = torch.Generator().manual_seed(7)
    low_rank = torch.randn(m, 4, generator=generator) @ torch.randn(4, m, generator=generator)
    a = torch.stack([torch.zeros(m, m), low_rank / m]).to(DEVICE)
    grad_z = torch.randn(a.shape, generator=generator).to(DEVICE)
    grads, outs = [], []
    for form in (fused_pinv, pytorch_pinv):
        leaf = a.clone().requires_grad_()
        outs.append(form(leaf, 6))
        grads.append(torch.autograd.grad(outs[-1], leaf, grad_z)[0])
    assert outs[0][0].abs().max() == 0 and torch.isinf(grads[1][0]).all()
    assert torch.equal(grads[0][0], grads[1][0])
    # Six steps leave a rank-deficient matrix unconverged, where rounding grows (both forms: ~10 m·u), so the
    # bound is the float32 PyTorch form's own error.
    expected = reference(a[1:], 6, "per_head")
    errors = [(out[1:].double() - expected).abs().max().item() for out in outs]
    assert torch.isfinite(outs[0][1]).all() and errors[0] <= 2 * errors[1], errors


def test_iterates_are_kept_only_when_autograd_records():
    """The forward keeps the ``n_iter`` iterates per problem (padded tiles) for the backward, and nothing under
    no_grad."""
    a = matrices("well", 16).requires_grad_()
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fused_pinv(a, 6)
    assert sorted(tuple(t.shape) for t in saved) == [(3, 6, 16, 16), (3, 16, 16)]
    with torch.no_grad():
        z, iterates = pinv_forward(a, None, 6, torch.is_grad_enabled())
    assert iterates.numel() == 0
    torch.testing.assert_close(z, fused_pinv(a, 6), rtol=0, atol=0)


@SLOW  # test_pinv_triton.py::test_compiles_to_one_graph_on_fake_tensors checks the one graph in the default suite
def test_compiled_with_fullgraph_runs_the_same_kernels():
    """``torch.compile(fullgraph=True)``: no graph break, one forward op and one backward op in the captured
    graphs, and the same numbers as eager (the same two launches)."""
    from torch._dynamo.backends.common import aot_autograd

    graphs: list = []

    def keep(graph, _inputs):
        graphs.append(graph)
        return graph.forward

    def loss(a):
        return (fused_pinv(a, 6) ** 2).sum()

    a = matrices("well", 16)
    compiled = torch.compile(loss, fullgraph=True, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    leaf_eager, leaf_compiled = a.clone().requires_grad_(), a.clone().requires_grad_()
    eager_value, compiled_value = loss(leaf_eager), compiled(leaf_compiled)
    eager_value.backward()
    compiled_value.backward()
    torch.testing.assert_close(compiled_value, eager_value, rtol=0, atol=0)
    torch.testing.assert_close(leaf_compiled.grad, leaf_eager.grad, rtol=0, atol=0)
    targets = [[str(node.target) for node in graph.graph.nodes if node.op == "call_function"] for graph in graphs]
    assert len(graphs) == 2 and [sum("lra_pinv" in t for t in ts) for ts in targets] == [1, 1], targets
    assert any("lra_pinv.forward" in t for t in targets[0]) and any("lra_pinv.backward" in t for t in targets[1])


def test_backward_of_an_unsaved_forward_says_what_to_call():
    a = matrices("well", 16).requires_grad_()
    z, _ = pinv_forward(a, None, 2, False)
    with pytest.raises(RuntimeError, match="save=False.*fused_pinv"):
        z.sum().backward()


def test_the_benchmarks_error_check_passes_the_kernels_and_fails_plain_tf32(monkeypatch):
    """``python -m lra.bench pinv``'s accuracy columns (what a GPU run checks beside the times): the kernels within
    ``4·m·u``, and the same check flags them with plain TF32 dots."""
    from lra.bench.pinv import errors

    checked = errors(fused_pinv, 2, 32, 6, torch.device(DEVICE))
    assert 0 < checked["error_fwd"] <= checked["bound"] and 0 < checked["error_grad"] <= checked["bound"], checked
    monkeypatch.setattr(forward, "PRECISION", "tf32")  # read when the interpreter runs a product
    rounded = errors(fused_pinv, 2, 32, 6, torch.device(DEVICE))
    assert rounded["error_fwd"] > checked["bound"], rounded


@triton.jit
def _split(X, HIGH, LOW, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(X + offs)
    tl.store(HIGH + offs, forward.tf32_part(x, False))
    tl.store(LOW + offs, forward.tf32_part(x, True))


def test_tf32_parts_round_to_nearest_ties_away_and_add_up_exactly():
    """:func:`kernels.pinv.forward.tf32_part`, which the serial backward's TF32 passes split each operand with: the
    high part is ``x`` rounded to TF32's 10 mantissa bits (to nearest, ties away from zero, against a float64
    reference), the low part the exact rest."""
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(1000, generator=generator) * torch.logspace(-30, 30, 1000)
    mantissa = torch.tensor([1.0 + k * 2.0**-10 + 2.0**-11 for k in (0, 1, 511, 1023)])  # exact ties
    values = torch.cat([values, mantissa, -mantissa, torch.zeros(1), 1.0 + torch.arange(1, 8) * 2.0**-13])
    x = torch.cat([values, torch.zeros(2048 - values.numel())]).to(torch.float32)
    high, low = torch.empty_like(x), torch.empty_like(x)
    high, low = high.to(DEVICE), low.to(DEVICE)
    _split[(1,)](x.to(DEVICE), high, low, 2048)
    high, low = high.cpu(), low.cpu()
    exact = x.double()
    spacing = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(2.0**-126))) - 10)
    expected = torch.sign(exact) * torch.floor(exact.abs() / spacing + 0.5) * spacing
    torch.testing.assert_close(high.double(), expected, rtol=0, atol=0)
    assert torch.equal(high + low, x)  # the rest is exact
    assert not np.any(high.numpy().view(np.uint32) & 0x1FFF)  # 13 low bits clear
