"""End-to-end training through the real entry point: results.json, clear errors, kill-and-resume. A run killed by a
signal is a real process (tests.conftest.run_cli); the others run ``lra.train``'s ``main()`` in this process
(tests.conftest.run_in_process)."""

from __future__ import annotations

import json
import signal

import pytest
import torch

from tests.conftest import run_cli, run_in_process

FAULTS = "+callbacks.faults._target_=tests.faults.Faults"  # the fault itself is chosen by LRA_FAULT_* (tests/faults.py)

RESULT_FIELDS = {
    "task", "attention", "seed", "status", "val_acc_best", "test_acc", "steps",
    "train_time_s", "samples_per_s", "peak_mem_bytes", "config",
}


def test_few_step_run_writes_results(tiny_listops_overrides, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_in_process(["-m", "lra.train", *tiny_listops_overrides, f"hydra.run.dir={run_dir}"])
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
    proc = run_in_process(["-m", "lra.train", *tiny_listops_overrides, "trainer.max_steps=3", "task.eval_every=5",
                           "verbose=true", f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 3
    assert [step for step, _ in results["val_curve"]] == [3]
    best = run_dir / "checkpoints" / "best-3.ckpt"
    assert results["best_checkpoint"] == str(best) and best.exists()
    assert torch.load(best, map_location="cpu", weights_only=False)["global_step"] == 3
    assert f"Loaded model weights from the checkpoint at {best}" in proc.stdout + proc.stderr  # trainer.test (verbose)
    assert 0.0 <= results["test_acc"] <= 1.0


def test_max_steps_zero_is_a_clear_error(tiny_listops_overrides, tmp_path):
    proc = run_in_process(["-m", "lra.train", *tiny_listops_overrides, "trainer.max_steps=0",
                           f"hydra.run.dir={tmp_path}"])
    assert proc.returncode != 0
    assert "trainer.max_steps must be an integer >= 1 (got 0)" in proc.stderr
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "failed"


def test_missing_listops_data_names_the_fix(tmp_path):
    proc = run_in_process([
        "-m", "lra.train", "task=listops", f"task.data_dir={tmp_path / 'absent'}", "logger=none",
        f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}",
    ])
    assert proc.returncode != 0
    assert "ListOps data not found" in proc.stderr and "download_lra.sh" in proc.stderr


def test_unknown_attention_or_task_is_rejected():
    for override in ("attention=no_such_attention", "task=no_such_task"):
        proc = run_in_process(["-m", "lra.train", override])
        assert proc.returncode != 0
        group, value = override.split("=")
        assert proc.stderr.startswith(f"[lra] FAILED: {override}: no config 'configs/{group}/{value}.yaml'")
        assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.process
def test_killed_run_resumes_from_its_last_checkpoint(tiny_listops_overrides, tmp_path):
    """SIGKILL at step 7 (no exception checkpoint): the same command resumes from last.ckpt of step 5."""
    run_dir = tmp_path / "run"
    args = ["-m", "lra.train", *tiny_listops_overrides, "task.eval_every=5", "trainer.max_steps=10", FAULTS,
            f"hydra.run.dir={run_dir}"]
    first = run_cli(args, env={"LRA_FAULT_SIGKILL_AT": "7"})
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert not (run_dir / "results.json").exists()

    second = run_in_process(args)
    assert second.returncode == 0, second.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 10
    assert results["resumed_from_step"] == 5
    assert "resuming from" in second.stdout


def checkpoint_step(path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


def test_last_checkpoint_follows_training_not_the_best_score(tiny_listops_overrides, tmp_path):
    """lr = 1e-30 (0 is refused): val/acc never improves after the first evaluation, yet last.ckpt holds the final step."""
    run_dir = tmp_path / "run"
    proc = run_in_process(["-m", "lra.train", *tiny_listops_overrides, "optimizer.lr=1e-30", "task.eval_every=5",
                           "trainer.max_steps=15", f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    checkpoints = run_dir / "checkpoints"
    assert sorted(path.name for path in checkpoints.glob("best-*.ckpt")) == ["best-5.ckpt"]
    assert checkpoint_step(checkpoints / "last.ckpt") == 15


@pytest.mark.process
def test_sigterm_saves_the_current_step_and_resumes_there(tiny_listops_overrides, tmp_path):
    """SIGTERM (e.g. SLURM preemption) between evaluations: interrupted-<step>.ckpt and last.ckpt at that step,
    results.json says ``interrupted`` at that step, the exit code is 143 (128 + SIGTERM); the same command
    resumes there and is evaluated once, at its last step (eval_every is longer than the run). The record's
    training time and samples count both processes (the interrupted one's from its checkpoint)."""
    run_dir = tmp_path / "run"
    args = ["-m", "lra.train", *tiny_listops_overrides, "task.eval_every=1000", "trainer.max_steps=6", FAULTS,
            f"hydra.run.dir={run_dir}"]
    first = run_cli(args, env={"LRA_FAULT_SIGTERM_AT": "3"})
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-3000:]
    assert "INTERRUPTED by SIGTERM (preempted or stopped) at step 3" in first.stdout
    interrupted = list((run_dir / "checkpoints").glob("interrupted-*.ckpt"))
    assert [path.name for path in interrupted] == ["interrupted-3.ckpt"], "no checkpoint was written on SIGTERM"
    assert checkpoint_step(interrupted[0]) == 3 and checkpoint_step(run_dir / "checkpoints" / "last.ckpt") == 3
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "interrupted" and record["steps"] == 3

    first_part = torch.load(interrupted[0], weights_only=False)
    batch_size = 16  # tiny_listops_overrides' task.batch_size; 64 train examples: every batch is full
    assert first_part["train_time_s"] > 0 and first_part["samples_seen"] == 3 * batch_size

    second = run_in_process(args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "(step 3)" in second.stdout
    record = json.loads((run_dir / "results.json").read_text())
    assert record["steps"] == 6 and record["resumed_from_step"] == 3
    assert [point[0] for point in record["val_curve"]] == [6]
    assert record["train_time_s"] > first_part["train_time_s"]
    assert record["samples_per_s"] * record["train_time_s"] == pytest.approx(6 * batch_size)
