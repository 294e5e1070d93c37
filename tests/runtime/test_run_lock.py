"""One process per run dir (``lra.runtime.run_lock``) — a real training process, a real ``fcntl`` lock.

The owner is paused mid-training (``LRA_FAULT_SIGSTOP_AT``: alive, its dir held); a second process (the test's
own, running ``lra.train``'s entry point: tests.conftest.run_in_process) is refused, naming the owner's pid, command
and the dir, before it writes anything there, ``.hydra/`` and Hydra's log included. Once the owner is SIGKILLed
the operating system has released its lock: the same command runs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lra import REPO_ROOT
from tests.conftest import run_in_process

FAULTS = "+callbacks.faults._target_=tests.faults.Faults"
pytestmark = pytest.mark.process  # every test pauses a training process


def paused(args: list[str], tmp_path: Path) -> subprocess.Popen:
    """``python <args>`` stopped by SIGSTOP after its training step 2 (output to files: a stopped process must not
    wait on a full pipe)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1",
           "LRA_FAULT_SIGSTOP_AT": "2"}
    with open(tmp_path / "owner.out", "w") as out, open(tmp_path / "owner.err", "w") as err:
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO_ROOT, env=env, stdout=out, stderr=err)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), (tmp_path / "owner.err").read_text()[-3000:]
    return proc


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``, byte for byte (``.hydra/``, logs, metrics, checkpoints, records)."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_second_process_is_refused_and_a_killed_owner_leaves_no_lock(tiny_listops_overrides, tmp_path):
    run_dir = tmp_path / "run"
    args = ["-m", "lra.train", *tiny_listops_overrides, FAULTS, f"hydra.run.dir={run_dir}"]
    owner = paused(args, tmp_path)
    try:
        before = snapshot(run_dir)
        assert ".hydra/overrides.yaml" in before and "owner.lock" in before
        for other in (args, [*args, "seed=1"]):  # the same command, and other settings
            refused = run_in_process(other)
            assert refused.returncode == 1, refused.stderr[-3000:]
            assert (f"[lra] IN USE: {run_dir} (hydra.run.dir) belongs to another running process: pid {owner.pid} "
                    f"on {socket.gethostname()}") in refused.stderr
            assert "-m lra.train task=listops_small task.data_dir=" in refused.stderr  # the owner's command
            assert "Nothing was written there" in refused.stderr
            assert snapshot(run_dir) == before, "the refused process wrote into the owner's run dir"
    finally:
        owner.kill()  # SIGKILL: no cleanup; the operating system drops the lock
        owner.wait()
    rerun = run_in_process(args)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "IN USE" not in rerun.stdout + rerun.stderr
    assert json.loads((run_dir / "results.json").read_text())["status"] == "completed"
    assert json.loads((run_dir / "owner.lock").read_text())["pid"] != owner.pid  # the new owner recorded itself


def test_a_running_sweep_refuses_a_second_sweep_and_runs_into_its_dir(tiny_listops_overrides, tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "lra.train", "-m", *tiny_listops_overrides, FAULTS, "seed=0,1", f"hydra.sweep.dir={sweep}"]
    owner = paused(args, tmp_path)  # its first job, paused after step 2
    try:
        before = snapshot(sweep)
        (job,) = [path.parent for path in sweep.glob("*/.hydra")]
        single = ["-m", "lra.train", *tiny_listops_overrides]
        for command, directory, key in [(args, sweep, "hydra.sweep.dir"), ([*single, f"hydra.run.dir={job}"], job,
                                         "hydra.run.dir"), ([*single, f"hydra.run.dir={sweep / 'extra'}"],
                                                            sweep / "extra", "hydra.run.dir")]:
            refused = run_in_process(command)
            assert refused.returncode == 1, refused.stderr[-3000:]
            assert f"[lra] IN USE: {directory} ({key}) belongs to another running process" in refused.stderr
            assert f"pid {owner.pid}" in refused.stderr
            assert snapshot(sweep) == before, f"{directory}: the refused process wrote into the sweep"
        assert not (sweep / "extra").exists()
    finally:
        owner.kill()
        owner.wait()
