"""Iterative pseudo-inverse (Nyströmformer eq. 16): convergence, rank deficiency, precision, errors."""

import pytest
import torch

from attention.pinv import iterative_pinv


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
