"""End-to-end training through the real CLI: results.json, clear errors, kill-and-resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from lra import REPO_ROOT
from tests.conftest import run_cli

RESULT_FIELDS = {
    "task", "attention", "seed", "status", "val_acc_best", "test_acc", "steps",
    "train_time_s", "samples_per_s", "peak_mem_bytes", "config",
}


def test_few_step_run_writes_results(tiny_listops_overrides, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["-m", "lra.train", *tiny_listops_overrides, f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert RESULT_FIELDS <= results.keys()
    assert results["status"] == "completed"
    assert results["steps"] == 4
    assert 0.0 <= results["test_acc"] <= 1.0
    assert results["samples_per_s"] > 0 and results["peak_mem_bytes"] > 0
    assert results["config"]["task"]["name"] == "listops_small"
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    assert f"run dir: {run_dir}" in proc.stdout


def test_max_steps_zero_is_a_clear_error(tiny_listops_overrides, tmp_path):
    proc = run_cli(["-m", "lra.train", *tiny_listops_overrides, "trainer.max_steps=0", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode != 0
    assert "trainer.max_steps must be >= 1" in proc.stderr
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "failed"


def test_missing_listops_data_names_the_fix(tmp_path):
    proc = run_cli([
        "-m", "lra.train", "task=listops", f"task.data_dir={tmp_path / 'absent'}", "logger=none",
        f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}",
    ])
    assert proc.returncode != 0
    assert "ListOps data not found" in proc.stderr and "download_lra.sh" in proc.stderr


def test_unknown_attention_or_task_is_rejected():
    for override in ("attention=no_such_attention", "task=no_such_task"):
        proc = run_cli(["-m", "lra.train", override])
        assert proc.returncode != 0
        assert "Could not find" in proc.stderr and override.split("=")[1] in proc.stderr


def test_killed_run_resumes_from_its_last_checkpoint(tiny_listops_overrides, tmp_path):
    run_dir = tmp_path / "run"
    args = ["-m", "lra.train", *tiny_listops_overrides, "task.eval_every=5", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "WANDB_SILENT": "true"}
    first = subprocess.Popen([sys.executable, *args, "trainer.max_steps=100000"], cwd=REPO_ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = run_dir / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 300
    while not last.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert last.exists(), "no checkpoint was written before the kill"
    assert not (run_dir / "results.json").exists(), "the run finished before it could be killed"

    second = run_cli([*args, "trainer.max_steps=40"])
    assert second.returncode == 0, second.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 40
    assert 5 <= results["resumed_from_step"] < 40
    assert "resuming from" in second.stdout
