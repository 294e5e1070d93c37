"""Multirun: separate run dirs, results and W&B offline runs per job; a failing job does not stop the sweep."""

from __future__ import annotations

import json

from tests.conftest import run_cli


def test_two_seeds_give_two_runs_with_their_own_results_and_wandb(tiny_listops_overrides, tmp_path):
    overrides = [o for o in tiny_listops_overrides if not o.startswith("logger=")]
    proc = run_cli(["-m", "lra.train", "-m", *overrides, "logger=wandb", "seed=0,1", "attention=softmax",
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


def test_a_failing_job_is_recorded_and_the_sweep_goes_on(tiny_listops_overrides, tmp_path):
    good = next(o for o in tiny_listops_overrides if o.startswith("task.data_dir="))
    overrides = [o for o in tiny_listops_overrides if o != good]
    bad_dir = tmp_path / "missing"
    proc = run_cli(["-m", "lra.train", "-m", *overrides, f"{good},{bad_dir}", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert proc.returncode != 0
    assert "1 job(s) of the sweep" in proc.stderr
    records = {json.loads(p.read_text())["config"]["task"]["data_dir"]: json.loads(p.read_text())
               for p in (tmp_path / "sweep").glob("*/results.json")}
    assert records[good.split("=", 1)[1]]["status"] == "completed"
    assert records[str(bad_dir)]["status"] == "failed"
    assert "ListOps data not found" in records[str(bad_dir)]["error"]
