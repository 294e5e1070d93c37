"""``logger=csv`` (lra.runtime.csv_logger): one metrics.csv per run dir, continued by a resumed run — the writer on its own,
then a real run killed after its checkpoint (a process of its own) and resumed, against the same run never stopped."""

from __future__ import annotations

import csv

import pytest

from lra.runtime.csv_logger import RunCSVLogger
from tests.conftest import run_cli, run_in_process

FAULTS = "+callbacks.faults._target_=tests.faults.Faults"
METRICS = ("csv", "version_0", "metrics.csv")


def rows(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_new_writer_continues_the_file_and_a_new_column_keeps_the_rows(tmp_path):
    first = RunCSVLogger(tmp_path)
    first.log_metrics({"train/loss": 2.5}, step=0)
    first.log_metrics({"train/loss": 2.25}, step=1)
    path = tmp_path.joinpath(*METRICS)
    written = path.read_bytes()

    second = RunCSVLogger(tmp_path)  # a resumed run's process
    second.log_hyperparams({"seed": 0})
    second.log_metrics({"train/loss": 2.0}, step=2)
    assert path.read_bytes().startswith(written) and second.experiment.rows == 3  # appended, the rows byte for byte
    second.log_metrics({"val/acc": 0.5}, step=2)  # a new column: the file again under the new header
    assert rows(path) == [{"step": "0", "train/loss": "2.5", "val/acc": ""}, {"step": "1", "train/loss": "2.25", "val/acc": ""},
                          {"step": "2", "train/loss": "2.0", "val/acc": ""}, {"step": "2", "train/loss": "", "val/acc": "0.5"}]
    assert sorted(p.name for p in tmp_path.joinpath("csv").iterdir()) == ["version_0"]
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_rows_after_the_checkpoint_are_cut_a_log_shorter_than_it_is_named_and_a_missing_one_started(tmp_path):
    logger = RunCSVLogger(tmp_path)
    for step in range(4):
        logger.log_metrics({"train/loss": float(step)}, step=step)
    logger.experiment.keep_rows(2, "last.ckpt")
    assert [row["step"] for row in rows(tmp_path.joinpath(*METRICS))] == ["0", "1"]
    assert RunCSVLogger(tmp_path).experiment.rows == 2
    with pytest.raises(ValueError, match=r"holds 2 rows, but last.ckpt was saved when it held 3: the log lost rows"):
        logger.experiment.keep_rows(3, "last.ckpt")
    tmp_path.joinpath(*METRICS).unlink()  # moved aside: the resumed run starts a new file
    logger.experiment.keep_rows(3, "last.ckpt")
    logger.log_metrics({"train/loss": 4.0}, step=4)
    assert rows(tmp_path.joinpath(*METRICS)) == [{"step": "4", "train/loss": "4.0"}]


@pytest.mark.process
def test_a_run_killed_after_its_checkpoint_and_resumed_logs_one_metrics_csv(tiny_listops_overrides, tmp_path):
    """SIGKILL at step 4: last.ckpt is from step 2 and the file holds a row of step 3 (logged as step 2), which the
    resumed run trains and logs again. The file ends as the never-stopped run's, byte for byte."""
    args = ["-m", "lra.train", *tiny_listops_overrides, "trainer.max_steps=6", "trainer.log_every_n_steps=1", FAULTS]
    run_dir, straight = tmp_path / "run", tmp_path / "straight"
    killed = run_cli([*args, f"hydra.run.dir={run_dir}"], env={"LRA_FAULT_SIGKILL_AT": "4"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    before = rows(run_dir.joinpath(*METRICS))
    assert [row["step"] for row in before if row["train/loss"]] == ["0", "1", "2"]  # the step-3 row is after last.ckpt

    resumed = run_in_process([*args, f"hydra.run.dir={run_dir}"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [path.relative_to(run_dir) for path in run_dir.rglob("metrics.csv")] == [run_dir.joinpath(*METRICS).relative_to(run_dir)]
    after = rows(run_dir.joinpath(*METRICS))
    assert [{key: row[key] for key in before[0]} for row in after[:3]] == before[:3]  # the first part's rows kept
    assert [row["step"] for row in after if row["train/loss"]] == ["0", "1", "2", "3", "4", "5"]
    assert "1 row(s) logged after" in resumed.stdout and "last.ckpt dropped" in resumed.stdout

    whole = run_in_process([*args, f"hydra.run.dir={straight}"])
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert run_dir.joinpath(*METRICS).read_bytes() == straight.joinpath(*METRICS).read_bytes()


def test_closing_the_wandb_run_needs_no_wandb_where_no_logger_made_one(monkeypatch):
    """``logger=csv`` runs on machines without wandb (as on a GPU lease): the end of a job imports nothing."""
    import sys

    from lra.runtime.wandb_summary import finish_wandb

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    finish_wandb()
