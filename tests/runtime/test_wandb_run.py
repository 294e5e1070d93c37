"""One training is one W&B run across a stop and its resume, its offline history holding each step once
(lra/runtime/wandb_logger.py, read back with lra/runtime/wandb_history.py)."""

from __future__ import annotations

from collections import Counter

from lra.runtime.wandb_history import RUN_FOLDER, history, run_folders
from tests.conftest import run_in_process

BOOKKEEPING = ("_step", "_runtime", "_timestamp", "trainer/global_step")


def points(run_dir) -> tuple[set[str], list[int], Counter]:
    """The run ids of the run dir's W&B folders, the history rows' ``_step`` in order, and how often each
    (metric, trainer/global_step, value) was logged."""
    folders = run_folders(run_dir / "wandb")
    rows = [row for folder in folders for path in folder.glob("run-*.wandb") for row in history(path)]
    logged = Counter((key, row.get("trainer/global_step"), value) for row in rows for key, value in row.items()
                     if key not in BOOKKEEPING)
    return {RUN_FOLDER.match(folder.name)["id"] for folder in folders}, [row["_step"] for row in rows], logged


def test_a_resumed_run_is_one_wandb_run_whose_history_holds_each_step_once(tiny_listops_overrides, tmp_path):
    """A run that fails in the middle of step 4 (its last checkpoint: step 2) and is resumed: both parts log to one
    W&B run id, the resumed part leaves out the step 3 the first part logged, numbers its rows after the first
    part's, and together they hold exactly the points, values included, of a run never stopped."""
    overrides = [*tiny_listops_overrides, "logger=wandb", "trainer.log_every_n_steps=1",
                 "+callbacks.faults._target_=tests.faults.Faults"]
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert run_in_process(["-m", "lra.train", *overrides, f"hydra.run.dir={whole}"]).returncode == 0
    failed = run_in_process(["-m", "lra.train", *overrides, f"hydra.run.dir={stopped}"], env={"LRA_FAULT_ERROR_AT": "3"})
    assert failed.returncode == 1
    resumed = run_in_process(["-m", "lra.train", *overrides, f"hydra.run.dir={stopped}"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "(step 2)" in resumed.stdout

    ids, steps, logged = points(stopped)
    assert len(run_folders(stopped / "wandb")) == 2 and len(ids) == 1
    assert steps == sorted(set(steps))  # the resumed part's rows follow the first part's
    _, _, uninterrupted = points(whole)
    # each point once, as in the run never stopped (values included: the resume is bit-identical); Lightning's
    # `epoch` goes with every row, twice where a training and a validation row share a step
    assert {k: n for k, n in logged.items() if k[0] != "epoch"} == {k: n for k, n in uninterrupted.items() if k[0] != "epoch"}
    assert set(logged) == set(uninterrupted)
    assert {key for key, _, _ in logged} >= {"train/loss", "val/acc", "test/acc"}
