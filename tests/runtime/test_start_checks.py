"""A command refused before anything is written (lra/runtime/start_checks.py, lra/runtime/unread_keys.py): a key
the command line adds that nothing reads, a sweep without -m, -m with hydra.run.dir, a folder lra.train did not make;
each one ``[lra] FAILED:`` line naming the key or file, and the run dir left as it was."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_in_process

# (overrides, what the line must say). The keys are new (`+`) or missing (no `+`: Hydra refuses, we add the line).
REFUSED = [
    (["+lerning_rate=1"], "+lerning_rate=1: lerning_rate is a new key that nothing reads"),
    (["+task.eval_evry=1"], "did you mean task.eval_every?"),
    (["+trainer.max_step=2"], "trainer.max_step is not a key of trainer (lightning.pytorch.Trainer): did you mean "
                              "trainer.max_steps?"),
    (["trainer.max_step=2"], "trainer.max_step is not a key of trainer (lightning.pytorch.Trainer): did you mean "
                             "trainer.max_steps?"),
    (["+task.datamodule.num_worker=2"], "did you mean task.datamodule.num_workers?"),
    (["experiment=cur_table1"], "experiment=cur_table1 is a sweep (task: listops,text"),
    (["-m", "seed=0,1"], "-m (a multirun) writes its jobs under hydra.sweep.dir and would ignore hydra.run.dir"),
]


@pytest.mark.parametrize("overrides, message", REFUSED)
def test_a_command_with_a_key_nothing_reads_is_refused_before_anything_is_written(tmp_path, overrides, message):
    run_dir = tmp_path / "run"
    result = run_in_process(["-m", "lra.train", *overrides, "logger=csv", f"hydra.run.dir={run_dir}",
                             f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("[lra] FAILED:") and message in last, result.stderr[-2000:]
    assert not run_dir.exists() and not (tmp_path / "sweep").exists()


def test_keys_that_something_reads_are_accepted():
    """An argument of a constructor (``+trainer.limit_val_batches``), a new callback, a new key of a node a
    constructor takes whole: not refused."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from lra.config import CONFIG_DIR
    from lra.runtime.unread_keys import unread_additions

    overrides = ["+trainer.limit_val_batches=2", "+callbacks.faults._target_=tests.faults.Faults",
                 "+optimizer.foreach=true", "finetune=lora", "seed=3"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    assert unread_additions(cfg, overrides) == []
    OmegaConf.set_struct(cfg, False)
    assert unread_additions(OmegaConf.merge(cfg, {"lerning_rate": 1}), ["+lerning_rate=1"]) != []


def test_a_folder_lra_did_not_make_is_not_written_over(tmp_path):
    """hydra.run.dir naming a user's folder with a results.json (no checkpoints): refused, the file unchanged, nothing
    added; a run dir of lra.train (its .hydra/) is not refused by this check."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "results.json").write_text('{"my": "numbers"}')
    result = run_in_process(["-m", "lra.train", "logger=csv", f"hydra.run.dir={folder}"])
    assert result.returncode == 1
    assert f"hydra.run.dir={folder} holds results.json, which no run of lra.train wrote" in result.stderr
    assert sorted(path.name for path in folder.iterdir()) == ["results.json"]
    assert json.loads((folder / "results.json").read_text()) == {"my": "numbers"}

    from lra.runtime.start_checks import foreign_files

    assert foreign_files(folder) == ["results.json"]
    (folder / ".hydra").mkdir()
    assert foreign_files(folder) == []
    assert foreign_files(tmp_path / "new") == []


@pytest.mark.parametrize("value, quoted", [("/tmp/x", "/tmp/x"), ("/tmp/a b", "/tmp/a b"), ("/tmp/é", '"/tmp/é"'),
                                           ('/tmp/q"é', "'/tmp/q\"é'")])
def test_a_run_dir_is_written_as_hydra_reads_it_back(value, quoted):
    """The resume command quotes for Hydra what its parser would not read unquoted (a non-ASCII character)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lra.runtime.job import hydra_value

    assert hydra_value(value) == quoted
    assert OverridesParser.create().parse_override(f"hydra.run.dir={quoted}").value() == value


def test_an_unquoted_non_ascii_run_dir_gets_the_quoted_form(tmp_path):
    run_dir = tmp_path / "é"
    result = run_in_process(["-m", "lra.train", f"hydra.run.dir={run_dir}"])
    assert result.returncode == 1 and not run_dir.exists()
    assert result.stderr.strip().splitlines()[-1] == (
        f"[lra] FAILED: hydra.run.dir={run_dir}: Hydra reads a value with non-ASCII characters only in quotes: write "
        f"'hydra.run.dir=\"{run_dir}\"' (quotes for Hydra inside quotes for the shell). Nothing was run or written")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without a GPU")
def test_trainer_gpu_without_a_gpu_is_one_line():
    from lra.runtime.config_checks import validate
    from tests.conftest import compose_config

    with pytest.raises(ValueError, match=r"^trainer.accelerator=gpu \(trainer=gpu / ddp\) needs a CUDA GPU and torch "
                                         r"sees none .*: train on the CPU with trainer=cpu"):
        validate(compose_config(["trainer=gpu"]))


@pytest.mark.process
@pytest.mark.parametrize("module", ["lra.train", "lra.analysis.report"])
def test_a_python_without_the_packages_points_to_the_venv(module):
    """``python -S`` (no site-packages: a Python outside the venv): one line naming what is missing and the venv,
    not a ModuleNotFoundError from inside an import."""
    import os
    import subprocess
    import sys

    from lra import REPO_ROOT

    result = subprocess.run([sys.executable, "-S", "-m", module], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, cwd=REPO_ROOT)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"[lra] FAILED: {sys.executable} has no omegaconf, hydra, torch, lightning: this is not the project's Python. "
        f"Activate its venv (source .venv/bin/activate, made by `make setup`) or run .venv/bin/python -m lra..."]
