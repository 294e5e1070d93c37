"""Same seed on CPU -> same test_acc and bit-identical weights, in another process too; the run dir keeps its config and
commit."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import run_cli, run_in_process


def train(overrides: list[str], run_dir, seed: int, run=run_in_process) -> tuple[dict, dict]:
    proc = run(["-m", "lra.train", *overrides, f"seed={seed}", f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    return json.loads((run_dir / "results.json").read_text()), weights


@pytest.mark.process
def test_same_seed_same_test_acc_and_weights(tiny_listops_overrides, tmp_path):
    first, w1 = train(tiny_listops_overrides, tmp_path / "a", seed=3, run=run_cli)  # a process of its own
    second, w2 = train(tiny_listops_overrides, tmp_path / "b", seed=3)
    other, w3 = train(tiny_listops_overrides, tmp_path / "c", seed=4)
    assert first["test_acc"] == second["test_acc"] and first["val_acc_best"] == second["val_acc_best"]
    assert all(torch.equal(w1[name], w2[name]) for name in w1)
    assert not all(torch.equal(w1[name], w3[name]) for name in w1)  # the check can tell seeds apart
    assert first["config"]["trainer"]["deterministic"] is True
    # resolved config and commit are kept in the run dir
    assert "seed: 3" in (tmp_path / "a" / "config_resolved.yaml").read_text() and first["git_commit"]
    assert "seed=3" in first["overrides"]


def test_commit_is_read_once_per_process(monkeypatch):
    """A commit made while a run trains must not be recorded as the run's code: the first answer is kept."""
    from lra.runtime import results

    results.git_commit.cache_clear()
    first = results.git_commit()
    assert first and len(first.split("+")[0]) == 40

    def fails(*args, **kwargs):
        raise AssertionError("git was asked again")

    monkeypatch.setattr(results.subprocess, "run", fails)
    assert results.git_commit() == first
    results.git_commit.cache_clear()
    with pytest.raises(AssertionError, match="asked again"):  # the test can fail: a fresh read does ask git
        results.git_commit()
