"""Multirun: separate run dirs, results and W&B offline runs per job (failed jobs: tests/runtime/test_sweeps.py)."""

from __future__ import annotations

import json

from tests.conftest import run_in_process


def test_two_seeds_give_two_runs_with_their_own_results_and_wandb(tiny_listops_overrides, tmp_path):
    overrides = [o for o in tiny_listops_overrides if not o.startswith("logger=")]
    proc = run_in_process(["-m", "lra.train", "-m", *overrides, "logger=wandb", "seed=0,1", "attention=softmax",
                           f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted(tmp_path.glob("*/results.json"))
    assert len(results) == 2
    records = [json.loads(path.read_text()) for path in results]
    assert sorted(record["seed"] for record in records) == [0, 1]
    assert all(record["status"] == "completed" for record in records)
    wandb_runs = sorted(tmp_path.glob("*/wandb/offline-run-*"))
    assert len(wandb_runs) == 2 and wandb_runs[0].parent != wandb_runs[1].parent
    groups = {record["config"]["group"] for record in records}
    assert groups == {tmp_path.name}

