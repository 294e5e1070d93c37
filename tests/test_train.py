"""End-to-end training through the real CLI: results.json, clear errors, kill-and-resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import torch

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
    assert [step for step, _ in results["val_curve"]] == [2, 4]  # every evaluation, not only up to the best
    assert 0.0 <= results["test_acc"] <= 1.0
    assert results["samples_per_s"] > 0 and results["peak_mem_bytes"] > 0
    assert results["config"]["task"]["name"] == "listops_small"
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    assert f"run dir: {run_dir}" in proc.stdout


def test_run_shorter_than_eval_every_is_evaluated_at_its_last_step(tiny_listops_overrides, tmp_path):
    """max_steps = 3, eval_every = 5: no periodic evaluation falls in the run, so step 3 is validated, saved as
    the best checkpoint and tested from it."""
    run_dir = tmp_path / "run"
    proc = run_cli(["-m", "lra.train", *tiny_listops_overrides, "trainer.max_steps=3", "task.eval_every=5",
                    f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 3
    assert [step for step, _ in results["val_curve"]] == [3]
    best = run_dir / "checkpoints" / "best-3.ckpt"
    assert results["best_checkpoint"] == str(best) and best.exists()
    assert torch.load(best, map_location="cpu", weights_only=False)["global_step"] == 3
    assert f"Loaded model weights from the checkpoint at {best}" in proc.stdout + proc.stderr  # trainer.test
    assert 0.0 <= results["test_acc"] <= 1.0


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


def checkpoint_step(path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


def test_last_checkpoint_follows_training_not_the_best_score(tiny_listops_overrides, tmp_path):
    """lr = 1e-30 (0 is refused): val/acc never improves after the first evaluation, yet last.ckpt holds the final step."""
    run_dir = tmp_path / "run"
    proc = run_cli(["-m", "lra.train", *tiny_listops_overrides, "optimizer.lr=1e-30", "task.eval_every=5",
                    "trainer.max_steps=15", f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    checkpoints = run_dir / "checkpoints"
    assert sorted(path.name for path in checkpoints.glob("best-*.ckpt")) == ["best-5.ckpt"]
    assert checkpoint_step(checkpoints / "last.ckpt") == 15


def test_sigterm_saves_the_current_step_and_resumes_there(tiny_listops_overrides, tmp_path):
    """SIGTERM (e.g. SLURM preemption) between evaluations: interrupted-<step>.ckpt and last.ckpt at that step,
    results.json says ``interrupted`` at that step, the exit code is 143 (128 + SIGTERM)."""
    run_dir = tmp_path / "run"
    args = ["-m", "lra.train", *tiny_listops_overrides, "task.eval_every=1000", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "WANDB_SILENT": "true"}
    first = subprocess.Popen([sys.executable, *args, "trainer.max_steps=100000", "trainer.log_every_n_steps=1"],
                             cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run_dir / "csv" / "version_0" / "metrics.csv"
    deadline = time.monotonic() + 300
    while first.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) > 3:
            break
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM
    interrupted = list((run_dir / "checkpoints").glob("interrupted-*.ckpt"))
    assert len(interrupted) == 1, "no checkpoint was written on SIGTERM"
    step = checkpoint_step(interrupted[0])
    assert step > 0 and checkpoint_step(run_dir / "checkpoints" / "last.ckpt") == step
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "interrupted" and record["steps"] == step

    # eval_every as long as the rest of the run: the resumed run is evaluated once, at its last step
    second = run_cli([*args, f"trainer.max_steps={step + 3}", f"task.eval_every={step + 3}"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"(step {step})" in second.stdout
    assert json.loads((run_dir / "results.json").read_text())["steps"] == step + 3
