"""Iterative pseudo-inverse (Nyströmformer eq. 16): convergence, rank deficiency, precision, errors."""

import pytest
import torch

from attention.pinv import iterative_pinv
from kernels.pinv.naive import reference_pinv

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def well_conditioned(batch, m, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.eye(m) + 0.3 * torch.randn(batch, m, m, generator=generator) / m**0.5


def test_converges_on_well_conditioned_matrices():
    a = well_conditioned(4, 16).double()
    z = iterative_pinv(a, 6)
    assert (a @ z @ a - a).abs().max() < 1e-10
    assert (z - torch.linalg.inv(a)).abs().max() < 1e-10


def test_row_stochastic_softmax_matrix_needs_more_iterations():
    generator = torch.Generator().manual_seed(1)
    a = torch.softmax(torch.randn(2, 40, 40, generator=generator, dtype=torch.float64) * 2, -1)
    error = [(a @ iterative_pinv(a, it) @ a - a).abs().max().item() for it in (2, 6, 30)]
    assert error[0] > error[1] > error[2] and error[2] < 1e-10


def test_rank_deficient_stays_finite_and_matches_pinv_on_its_range():
    generator = torch.Generator().manual_seed(2)
    left, right = torch.randn(3, 12, 4, generator=generator), torch.randn(3, 4, 12, generator=generator)
    u = (left @ right).double()  # rank 4
    z = iterative_pinv(u, 40)
    assert torch.isfinite(z).all()
    assert (u @ z @ u - u).abs().max() < 1e-6 * u.abs().max()
    assert torch.isfinite(iterative_pinv(torch.zeros(2, 5, 5), 6)).all()


def test_runs_in_float32_under_autocast():
    a = well_conditioned(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = iterative_pinv(a.bfloat16(), 6)
    assert z.dtype == torch.float32
    assert (a @ z @ a - a).abs().max() < 5e-2  # bf16 rounding of the input only


@pytest.mark.parametrize("bad", [0, -1])
def test_rejects_fewer_than_one_iteration(bad):
    with pytest.raises(ValueError, match="pinv_iters"):
        iterative_pinv(torch.eye(3), bad)


# --- Z₀ scale: per (batch, head) as the paper writes, or one maximum over the batch as the public code ---


def softmax_heads(batch=2, temperatures=(0.3, 3.0), m=12, seed=3):
    """Row-stochastic ``(batch, heads, m, m)`` softmax matrices; a sharper head has larger column sums ‖A‖₁."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, len(temperatures), m, m, generator=generator, dtype=torch.float64)
    return torch.softmax(logits * torch.tensor(temperatures, dtype=torch.float64)[:, None, None], -1)


@pytest.mark.parametrize("init", ["per_head", "global"])
@pytest.mark.parametrize("n_iter", [1, 6])
def test_matches_dense_reference(init, n_iter):
    scaled = well_conditioned(6, 7).double().view(2, 3, 7, 7) * torch.tensor([1.0, 5.0, 0.2], dtype=torch.float64)[:, None, None]
    for a in (softmax_heads(), scaled):
        torch.testing.assert_close(iterative_pinv(a, n_iter, init), reference_pinv(a, n_iter, init), atol=1e-12, rtol=1e-10)


def test_global_init_couples_heads_of_different_scale():
    """A flat head next to a sharp one: ``global`` starts it from the sharp head's ‖A‖₁, so after 6 iterations it
    is further from A⁺ than with ``per_head``, and it changes when only the other head changes."""
    a = softmax_heads()
    per_head, globally = iterative_pinv(a, 6, "per_head"), iterative_pinv(a, 6, "global")
    assert (per_head - globally)[:, 0].abs().max() > 1e-2
    residual = lambda z: (a @ z @ a - a)[:, 0].abs().max()  # noqa: E731
    assert residual(globally) > 1.5 * residual(per_head)  # measured: 0.011 vs 0.0062
    other = a.clone()
    other[1, 1, :, 0] += 1.0  # change one matrix of the other sequence only: its column sum becomes the batch maximum
    assert torch.equal(iterative_pinv(other, 6, "per_head")[0], per_head[0])
    assert not torch.allclose(iterative_pinv(other, 6, "global")[0], globally[0], atol=1e-6)


def test_inits_agree_for_a_single_matrix():
    a = softmax_heads(batch=1, temperatures=(3.0,))
    assert torch.equal(iterative_pinv(a, 6, "global"), iterative_pinv(a, 6, "per_head"))
    assert torch.equal(iterative_pinv(a[0, 0], 6, "global"), iterative_pinv(a[0, 0], 6, "per_head"))


def test_global_init_is_the_reference_codes_start_on_softmax_matrices():
    """mlpen/Nystromformer's default ("original") start is ``Aᵀ / max(column sums over the whole tensor)``;
    for softmax matrices (row sums 1) that is our ``global`` Z₀, so one iteration and six agree."""
    a = softmax_heads(batch=3, temperatures=(0.3, 1.0, 3.0))
    eye = torch.eye(12, dtype=torch.float64)
    z = a.transpose(-1, -2) / a.sum(-2).max()
    for n_iter in range(1, 7):
        p = a @ z
        z = 0.25 * z @ (13 * eye - p @ (15 * eye - p @ (7 * eye - p)))
        torch.testing.assert_close(iterative_pinv(a, n_iter, "global"), z, atol=1e-12, rtol=1e-10)


def test_rejects_unknown_init():
    with pytest.raises(ValueError, match="attention.pinv_init"):
        iterative_pinv(torch.eye(3), 6, "batch")


@pytest.mark.parametrize("init", ["per_head", "global"])
def test_backward_is_the_chain_rule_through_every_iteration(init):
    """The pseudo-inverse's one-node backward (kernels/pinv/ops.py ``Iterations``) against autograd through the same
    iterations written out op by op, and against finite differences (float64), identity block included."""
    torch.manual_seed(0)
    a = torch.softmax(torch.randn(2, 3, 7, 7, dtype=torch.float64), -1)
    a[1, 2, 5:] = torch.eye(7, dtype=torch.float64)[5:]  # CUR's identity rows on invalid landmarks
    a.requires_grad_()
    grad = torch.randn(2, 3, 7, 7, dtype=torch.float64)

    def unfused(matrix):
        absolute = matrix.abs()
        col_sum, row_sum = absolute.sum(-2).amax(-1), absolute.sum(-1).amax(-1)
        if init == "global":
            col_sum, row_sum = col_sum.amax(), row_sum.amax()
        z = matrix.transpose(-1, -2) / (col_sum * row_sum)[..., None, None]
        eye = torch.eye(7, dtype=matrix.dtype)
        for _ in range(4):
            az = matrix @ z
            z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
        return z

    ours = torch.autograd.grad(iterative_pinv(a, 4, init), a, grad)[0]
    reference = torch.autograd.grad(unfused(a), a, grad)[0]
    torch.testing.assert_close(ours, reference, rtol=1e-10, atol=1e-12)
    general = torch.randn(1, 2, 5, 5, dtype=torch.float64) + 3 * torch.eye(5, dtype=torch.float64)  # no tied norms
    assert torch.autograd.gradcheck(lambda x: iterative_pinv(x, 2, init), (general.requires_grad_(),))
