"""A run's record through re-runs, SIGTERM, divergence and bad settings — the real entry point, in this process where
the test is about what a run records and prints, in a real process where it is about signals or the exit status.

- a completed run (or sweep) re-run into its dir is skipped and its results.json is kept byte for byte;
- a run killed after its last step resumes there and tests the best checkpoint (which exists);
- SIGTERM and Ctrl-C record ``status: interrupted`` with the step and exit 143 / 130; a sweep also lists the jobs it
  never started (``not_started``) and re-running it finishes only those;
- a NaN loss, an empty split and settings with which no evaluation runs stop with the key to fix;
- a failure prints ``[lra] FAILED: ...`` last and writes its traceback to ``error.log``;
- ``lra.evaluate`` writes under ``outputs/evaluations``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from lra import REPO_ROOT
from lra.runtime.interrupts import SIGTERM_EXIT_CODE, exit_code
from lra.train import validate
from tests.conftest import CONFIG_DIR, compose_config, run_cli, run_in_process


def start(args: list[str]) -> subprocess.Popen:
    """``python <args>`` in the background (output to pipes read after it ends)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, *args], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("override, message", [
    ("optimizer.lr=nan", "optimizer.lr must be a finite number > 0 (got nan)"),
    ("optimizer.lr=-1e-3", "optimizer.lr must be a finite number > 0"),
    ("task.batch_size=0", "task.batch_size must be an integer >= 1 (got 0)"),
    ("seed=abc", "seed must be an integer (got 'abc')"),
    ("seed=1.5", "seed must be an integer (got 1.5)"),
    ("task.max_length=0", "task.max_length must be an integer >= 1 (got 0)"),
    ("trainer.max_steps=abc", "trainer.max_steps must be an integer >= 1 (got 'abc')"),
    ("model.dropout=1.5", "model.dropout must be a probability in [0, 1) (got 1.5)"),
    ("attention.dropout=-0.1", "attention.dropout must be a probability in [0, 1) (got -0.1)"),
    ("attention.dropout=1", "attention.dropout must be a probability in [0, 1) (got 1)"),
    ("model.dropout=abc", "model.dropout must be a probability in [0, 1) (got 'abc')"),
    ("model=mega model.block.attention_dropout=2",
     "model.block.attention_dropout must be a probability in [0, 1) (got 2)"),
])
def test_bad_settings_name_the_key_and_the_fix(override, message, tmp_path):
    overrides = ["task=listops_small", "task.eval_every=5", "trainer.max_steps=10", *override.split()]
    cfg = compose_config(overrides, tmp_path)
    with pytest.raises(ValueError) as error:
        validate(cfg)
    text = str(error.value)
    assert message in text
    assert "e.g." in text  # the fix


def test_seed_abc_on_the_command_line_names_the_key(tiny_listops_overrides, tmp_path):
    proc = run_in_process(["-m", "lra.train", *tiny_listops_overrides, "seed=abc", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 1
    assert "seed must be an integer (got 'abc')" in proc.stderr
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "failed"


def test_rerun_of_a_completed_run_keeps_its_record_and_a_killed_finish_resumes(tiny_listops_overrides, tmp_path):
    run_dir = tmp_path / "run"
    args = ["-m", "lra.train", *tiny_listops_overrides, f"hydra.run.dir={run_dir}"]
    first = run_in_process(args)
    assert first.returncode == 0, first.stderr[-3000:]
    record = (run_dir / "results.json").read_bytes()
    original = json.loads(record)

    again = run_in_process(args)  # same settings: skipped, record untouched
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[lra] already completed" in again.stdout
    assert (run_dir / "results.json").read_bytes() == record
    louder = run_in_process([*args, "verbose=true", "logger=none"])  # keys a resume ignores: the same run, done
    assert louder.returncode == 0 and "[lra] already completed" in louder.stdout, louder.stderr[-3000:]
    assert (run_dir / "results.json").read_bytes() == record

    other = run_in_process([*args, "trainer.max_steps=6"])  # other settings: refused, record untouched
    assert other.returncode == 1
    assert "NOT RE-RUN" in other.stderr and "trainer.max_steps: 4 -> 6" in other.stderr
    assert (run_dir / "results.json").read_bytes() == record

    # Killed between its last step and its results (the record is gone): resumes at the last step and
    # tests the best checkpoint last.ckpt names (it was saved after that step's validation, so it exists).
    (run_dir / "results.json").unlink()
    resumed = run_in_process(args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again_record = json.loads((run_dir / "results.json").read_text())
    assert again_record["status"] == "completed" and again_record["resumed_from_step"] == 4
    assert again_record["test_acc"] == original["test_acc"]
    assert Path(again_record["best_checkpoint"]).is_file()
    assert [point[0] for point in again_record["val_curve"]] == [2, 4]


def test_nan_loss_fails_the_run_naming_the_step(tiny_listops_overrides, tmp_path):
    proc = run_in_process(["-m", "lra.train", *tiny_listops_overrides, "optimizer.lr=1e6", "scheduler=none",
                           "trainer.max_steps=10", "task.eval_every=5", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 1
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["status"] == "failed" and record["error"].startswith("NonFiniteLossError: train/loss is")
    assert f"at step {record['steps']}" in record["error"] and "optimizer.lr" in record["error"]
    assert record["steps"] < 10
    assert not list((tmp_path / "checkpoints").glob("interrupted-*.ckpt"))  # a NaN model is not kept to resume


def test_empty_val_split_stops_before_training(tiny_listops, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tiny_listops, data)
    header = (data / "basic_val.tsv").read_text().splitlines()[0]
    (data / "basic_val.tsv").write_text(header + "\n")
    proc = run_in_process(["-m", "lra.train", "task=listops_small", f"task.data_dir={data}",
                           f"paths.cache_dir={tmp_path / 'cache'}", "trainer.max_steps=4", "task.eval_every=2",
                           "logger=none", f"hydra.run.dir={tmp_path / 'run'}"])
    assert proc.returncode == 1
    assert "the val split is empty" in proc.stderr  # raised by the datamodule (lra/tasks/base.py)
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["status"] == "failed" and "val split is empty" in record["error"]


@pytest.mark.process
@pytest.mark.slow
def test_sigterm_interrupts_a_sweep_and_a_rerun_finishes_only_what_is_unfinished(tiny_listops_overrides, tmp_path):
    sweep = tmp_path / "sweep"
    base = ["-m", "lra.train", "-m", *tiny_listops_overrides, "seed=0,1", "trainer.max_steps=6",
            "+callbacks.faults._target_=tests.faults.Faults", f"hydra.sweep.dir={sweep}"]
    proc = run_cli(base, env={"LRA_FAULT_SIGTERM_AT": "3"})  # the first job is stopped at step 3, the sweep with it
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == SIGTERM_EXIT_CODE, err[-3000:]
    job0, job1 = sorted(path for path in sweep.iterdir() if path.is_dir() and not path.name.startswith("."))
    first, second = (json.loads((job / "results.json").read_text()) for job in (job0, job1))
    assert first["status"] == "interrupted" and first["steps"] > 0
    assert second["status"] == "not_started" and second["seed"] == 1 and "seed=1" in second["overrides"]
    assert "[lra] INTERRUPTED by SIGTERM" in out
    assert f"{job0}: interrupted at step {first['steps']}" in err and f"{job1}: not_started" in err

    steps = 6
    finish = base  # a resume keeps the run's settings, trainer.max_steps included
    done = run_in_process(finish)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads((job / "results.json").read_text()) for job in (job0, job1)]
    assert [r["status"] for r in records] == ["completed", "completed"]
    assert records[0]["resumed_from_step"] == first["steps"] and records[1]["resumed_from_step"] is None
    assert all(r["steps"] == steps for r in records)

    kept = [(job / "results.json").read_bytes() for job in (job0, job1)]
    again = run_in_process(finish)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("[lra] already completed") == 2
    assert [(job / "results.json").read_bytes() for job in (job0, job1)] == kept


@pytest.mark.process
@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])  # one handler
def test_a_stop_before_training_starts_is_an_interruption(tiny_listops_overrides, tmp_path, signum):
    """SIGTERM or Ctrl-C while the run is set up (outside Lightning's handler) is recorded as an interruption too."""
    proc = start(["-m", "lra.train", *tiny_listops_overrides, f"hydra.run.dir={tmp_path}"])
    first_line = proc.stdout.readline()  # "[lra] run dir: ..." is printed once the handler is in place
    assert "run dir:" in first_line
    os.kill(proc.pid, signum)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == exit_code(signum), err[-3000:]
    assert f"[lra] INTERRUPTED by {signal.Signals(signum).name}" in out
    assert f"re-run the same command with hydra.run.dir={tmp_path} to start it again" in out
    assert "KeyboardInterrupt" not in out + err
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "interrupted"


@pytest.mark.process
def test_a_failure_prints_its_line_last_and_its_traceback_to_error_log(tiny_listops_overrides, tmp_path):
    """The clear line is the last thing on the console (stdout and stderr together); the traceback is in
    ``error.log``, and on the console too with HYDRA_FULL_ERROR=1."""
    command = [sys.executable, "-m", "lra.train", *tiny_listops_overrides, "task.datamodule.num_workers=-1",
               f"hydra.run.dir={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    for full_error in (None, "1"):
        if full_error is None:  # a real process: its console and exit status
            proc = subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=600)
        else:  # the same entry point in this process (no import cost), its output merged the same way
            proc = run_in_process(command[1:], env={"HYDRA_FULL_ERROR": full_error}, merge_output=True)
        assert proc.returncode == 1, proc.stdout[-3000:]
        lines = proc.stdout.strip().splitlines()
        assert lines[-1].startswith("[lra] FAILED: ValueError: task.datamodule.num_workers must be an integer >= 0 "
                                    "(got -1)")
        assert f"traceback in {tmp_path / 'error.log'}" in lines[-1]
        assert ("Traceback (most recent call last)" in proc.stdout) == (full_error == "1")
        assert "in validate" in (tmp_path / "error.log").read_text()
        record = json.loads((tmp_path / "results.json").read_text())
        assert record["status"] == "failed" and record["error"].startswith("ValueError: task.datamodule.num_workers")


def test_evaluate_writes_under_outputs_evaluations():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        evaluation = compose(config_name="evaluate", overrides=["ckpt_path=x.ckpt"], return_hydra_config=True)
        training = compose(config_name="train", return_hydra_config=True)
    assert "/evaluations/" in evaluation.hydra.run.dir and "/evaluations/" in evaluation.hydra.sweep.dir
    assert "/runs/" in training.hydra.run.dir and "/evaluations/" not in training.hydra.sweep.dir


def test_the_hint_to_train_a_finished_run_longer_works(tiny_listops_overrides, tmp_path):
    """Re-running a completed run with more steps is refused (a resume cannot change the schedule); the command the
    refusal prints trains those settings in a new run dir from the run's weights, and completes."""
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    args = ["-m", "lra.train", *tiny_listops_overrides, f"paths.log_dir={logs}"]
    assert run_in_process([*args, f"hydra.run.dir={run_dir}"]).returncode == 0
    longer = run_in_process([*args, "trainer.max_steps=6", f"hydra.run.dir={run_dir}"])
    assert longer.returncode == 1 and "NOT RE-RUN" in longer.stderr and "delete" not in longer.stderr
    hint = re.search(r"run them in a new run dir: (python -m lra\.train .*?); from scratch", longer.stderr).group(1)
    command = shlex.split(hint)
    assert command[-1] == f"init_from={run_dir / 'checkpoints' / 'last.ckpt'}" and "trainer.max_steps=6" in command
    followed = run_in_process(command[1:])  # as printed, without `python`
    assert followed.returncode == 0, followed.stderr[-3000:]
    (record_path,) = (logs / "runs").rglob("results.json")
    record = json.loads(record_path.read_text())
    assert record["status"] == "completed" and record["steps"] == 6
    assert record["config"]["init_from"] == str(run_dir / "checkpoints" / "last.ckpt")
