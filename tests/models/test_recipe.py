"""The reference LRA recipe (mlpen/Nystromformer LRA code) pinned: embedding init, OneCycle lr and β1, pooling."""

from __future__ import annotations

import functools

import pytest
import torch

from lra.build import build_model, build_module
from models.pooling import masked_mean, padded_mean
from tests.conftest import compose_config


def embedding_stds(overrides: list[str]) -> tuple[float, float]:
    torch.manual_seed(0)
    model = build_model(compose_config(["task=listops", *overrides]))
    return model.token_embedding.weight.std().item(), model.position_embedding.weight.std().item()


def test_embeddings_start_at_the_reference_std_and_the_old_init_stays_reachable():
    token, position = embedding_stds([])
    assert token == pytest.approx(0.02, rel=0.1) and position == pytest.approx(0.02, rel=0.02)
    token, position = embedding_stds(["model.embedding_init_std=null"])  # PyTorch's N(0, 1)
    assert token == pytest.approx(1.0, rel=0.1) and position == pytest.approx(1.0, rel=0.02)


def schedule_trace(overrides: list[str]) -> list[tuple[float, float]]:
    """``(lr, beta1)`` used by each optimizer step of the ListOps schedule (the optimizer steps on no gradient)."""
    cfg = compose_config(["task=listops", *overrides])
    setup = build_module(cfg).configure_optimizers()
    optimizer, scheduler = setup["optimizer"], setup["lr_scheduler"]["scheduler"]
    trace = []
    for _ in range(cfg.trainer.max_steps):
        group = optimizer.param_groups[0]
        trace.append((group["lr"], group["betas"][0]))
        optimizer.step()
        scheduler.step()
    return trace


def test_one_cycle_is_the_default_with_the_reference_lr_and_beta1():
    cfg = compose_config(["task=listops"])
    assert cfg.scheduler._target_ == "lra.schedules.one_cycle"
    trace = schedule_trace([])
    max_lr, start, end = 1e-4, 1e-4 / 25, 1e-4 / 25 / 1e4
    peak = 999  # OneCycleLR peaks at pct_start * total_steps - 1 = 1000 - 1
    assert trace[0] == pytest.approx((start, 0.95))
    assert trace[peak] == pytest.approx((max_lr, 0.85))
    assert trace[-1] == pytest.approx((end, 0.95), rel=1e-6, abs=1e-12)
    # Linear in between (anneal_strategy: linear), on both sides of the peak.
    assert trace[500][0] == pytest.approx(start + (max_lr - start) * 500 / 999)
    assert trace[3000][0] == pytest.approx(max_lr + (end - max_lr) * (3000 - 999) / (4999 - 999))
    assert trace[3000][1] == pytest.approx(0.85 + 0.10 * (3000 - 999) / (4999 - 999))


def test_old_warmup_linear_schedule_stays_reachable():
    trace = schedule_trace(["scheduler=warmup_linear"])
    assert trace[0] == pytest.approx((1e-7, 0.9))
    assert trace[999] == pytest.approx((1e-4, 0.9))
    assert trace[-1][0] == pytest.approx(1e-4 / 4000)


@pytest.mark.parametrize("max_steps", [1, 2, 3, 40])
def test_one_cycle_survives_runs_shorter_than_the_warmup(max_steps):
    """Debug runs (trainer.max_steps below task.warmup_steps) clip the warmup instead of crashing."""
    trace = schedule_trace([f"trainer.max_steps={max_steps}"])
    assert len(trace) == max_steps and all(0 < lr <= 1e-4 and 0.85 <= beta1 <= 0.95 for lr, beta1 in trace)


def test_pooling_options():
    torch.manual_seed(0)
    x = torch.randn(3, 7, 4)
    key_mask = torch.arange(7) < torch.tensor([7, 4, 1])[:, None]
    real_means = torch.stack([x[i, :n].mean(0) for i, n in enumerate([7, 4, 1])])
    torch.testing.assert_close(masked_mean(x, key_mask), real_means)
    # The reference: zero the pad rows, pad to the task's max length, average over every position.
    padded = torch.cat([x * key_mask[..., None], torch.zeros(3, 13, 4)], dim=1)
    torch.testing.assert_close(padded_mean(x, key_mask, padded_length=20), padded.mean(1))
    with pytest.raises(ValueError, match="padded_length=5"):
        padded_mean(x, key_mask, padded_length=5)


def test_pooling_is_a_config_choice():
    default = build_model(compose_config(["task=listops"]))
    assert default.pool is masked_mean or getattr(default.pool, "func", None) is masked_mean
    reference = build_model(compose_config(["task=listops", "model/pooling=padded_mean"]))
    assert isinstance(reference.pool, functools.partial) and reference.pool.func is padded_mean
    assert reference.pool.keywords == {"padded_length": 2000}
