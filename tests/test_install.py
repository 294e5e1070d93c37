"""The project installed into its virtualenv (``make setup``: ``pip install -e .``): the ``lra-*`` commands and
``python -m lra.*`` work from any directory, with the checkout's ``configs/``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = ["lra-train", "lra-evaluate", "lra-report", "lra-bench", "lra-dashboard"]
BIN = Path(sys.executable).parent


def outside_the_checkout(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``args`` run from ``cwd`` with no PYTHONPATH: only the installed package can be imported."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(WANDB_SILENT="true", OMP_NUM_THREADS="1")
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_commands_are_installed():
    missing = [command for command in COMMANDS if not (BIN / command).exists()]
    assert not missing, f"{missing} not in {BIN}: install the project into the virtualenv with `make setup` (pip install -e .)"


@pytest.mark.process
@pytest.mark.parametrize("command", ["lra-evaluate", "lra-report", "lra-bench", "lra-dashboard"])  # lra-train: the run below
def test_command_starts_from_another_directory(command, tmp_path):
    proc = outside_the_checkout([str(BIN / command), "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.process
def test_report_and_dashboard_start_without_torch(tmp_path):
    """``lra-report`` and ``lra-dashboard`` read JSON and YAML: importing them must not import torch or Lightning
    (most of a CLI's start-up), so they answer at once (:mod:`lra.tasks.first_operator` is why they can)."""
    heavy = "import sys, lra.analysis.report, lra.analysis.dashboard; print(sorted({'torch', 'lightning'} & set(sys.modules)))"
    proc = outside_the_checkout([sys.executable, "-c", heavy], tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-3000:]


@pytest.mark.process
def test_python_m_composes_the_config_from_another_directory(tmp_path):
    proc = outside_the_checkout([sys.executable, "-m", "lra.train", "task=listops_small", "--cfg", "job"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "name: listops_small" in proc.stdout


@pytest.mark.process
def test_lra_train_runs_from_another_directory(tiny_listops_overrides, tmp_path):
    run_dir = tmp_path / "run"
    proc = outside_the_checkout([str(BIN / "lra-train"), *tiny_listops_overrides, "trainer.max_steps=2",
                                 f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 2
    assert not (tmp_path / "outputs").exists()  # outputs stay in the checkout (paths.root_dir), not the cwd
