"""Faults against a run dir: a refused resume changes nothing, a cut-short checkpoint is skipped, a full disk
leaves no partial file, a checkpoint that does not load is named — faults from tests/faults.py; a signal stops a real
process, the runs that follow run the same entry point in this process (tests.conftest.run_in_process)."""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lra.runtime.checkpoints import AtomicCheckpointIO, DiskFull, read_checkpoint
from lra.runtime.run_dir import settings_differences
from lra.tasks.files import atomic_write
from lra.tasks.listops import read_tsv
from lra.tasks.listops_generator import HEADER
from lra.runtime.interrupts import SIGTERM_EXIT_CODE
from lra.train import note_exact_landmarks
from tests.conftest import REPO_ROOT, compose_config, run_cli, run_in_process
from tests.faults import full_disk_write

FAULTS = "+callbacks.faults._target_=tests.faults.Faults"


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every checkpoint and record of the run, byte for byte."""
    files = [*(run_dir / "checkpoints").iterdir(), run_dir / "results.json", run_dir / "config_resolved.yaml"]
    return {path.name: path.read_bytes() for path in files}


@pytest.mark.process
def test_refused_resume_changes_nothing_and_a_cut_short_checkpoint_is_skipped(tiny_listops_overrides, tmp_path):
    run_dir = tmp_path / "run"
    args = ["-m", "lra.train", *tiny_listops_overrides, "trainer.max_steps=6", FAULTS, f"hydra.run.dir={run_dir}"]
    first = run_cli(args, env={"LRA_FAULT_SIGTERM_AT": "3"})
    assert first.returncode == SIGTERM_EXIT_CODE, first.stderr[-3000:]
    kept = snapshot(run_dir)
    assert {"best-2.ckpt", "last.ckpt", "interrupted-3.ckpt"} <= kept.keys()
    interrupted = json.loads(kept["results.json"])
    assert interrupted["status"] == "interrupted" and [point[0] for point in interrupted["val_curve"]] == [2]

    for override, named in [("seed=1", "seed: 0 (the run) -> 1 (this command)"),
                            ("optimizer.lr=1e-3", "optimizer.lr: 0.0001 (the run) -> 0.001 (this command)"),
                            ("trainer.max_steps=8", "trainer.max_steps: 6 (the run) -> 8 (this command)")]:
        refused = run_in_process([*args, override])
        assert refused.returncode == 1, refused.stderr[-3000:]
        assert "NOT RESUMED" in refused.stderr and named in refused.stderr
        assert "init_from=" in refused.stderr and "nothing in" in refused.stderr
        assert snapshot(run_dir) == kept, f"{override}: a refused run changed the run dir"

    # A kill during an old, non-atomic save: last.ckpt and interrupted-3.ckpt cut short. The same command names
    # them, moves them aside and resumes from the newest intact checkpoint (best-2.ckpt).
    for name in ("last.ckpt", "interrupted-3.ckpt"):
        path = run_dir / "checkpoints" / name
        path.write_bytes(kept[name][: len(kept[name]) // 2])
    resumed = run_in_process(args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "last.ckpt does not load" in resumed.stdout and "interrupted-3.ckpt does not load" in resumed.stdout
    assert f"resuming from {run_dir / 'checkpoints' / 'best-2.ckpt'} (step 2)" in resumed.stdout
    assert (run_dir / "checkpoints" / "last.ckpt.corrupt").is_file()
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed" and record["steps"] == 6 and record["resumed_from_step"] == 2
    assert [point[0] for point in record["val_curve"]] == [2, 4, 6]


def test_full_disk_leaves_no_partial_checkpoint_and_the_rerun_completes(tiny_listops_overrides, tmp_path):
    run_dir = tmp_path / "run"
    args = ["-m", "lra.train", *tiny_listops_overrides, FAULTS, f"hydra.run.dir={run_dir}"]
    full = run_in_process(args, env={"LRA_FAULT_ENOSPC_AT": "3"})  # the step-4 checkpoints hit a full disk
    assert full.returncode == 1, full.stderr[-3000:]
    last_line = full.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"[lra] FAILED: DiskFull: disk full while writing {run_dir / 'checkpoints'}/")
    assert re.search(r"\.ckpt \([0-9.]+ [kMG]?B(ytes)? left\): free space, then re-run the same command to resume",
                     last_line), last_line
    assert "inline_container" not in last_line and "RuntimeError" in (run_dir / "error.log").read_text()
    folder = run_dir / "checkpoints"
    assert not [path for path in run_dir.rglob("*") if path.name.endswith(".tmp")]
    assert sorted(path.name for path in folder.iterdir()) == ["best-2.ckpt", "last.ckpt"]
    assert all(torch.load(path, weights_only=False)["global_step"] == 2 for path in folder.iterdir())
    assert json.loads((run_dir / "results.json").read_text())["status"] == "failed"

    rerun = run_in_process(args)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed" and record["steps"] == 4 and record["resumed_from_step"] == 2


def test_a_failed_write_leaves_neither_a_partial_file_nor_its_temporary(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old")

    def full_disk(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(target, full_disk)
    assert target.read_text() == "old" and sorted(tmp_path.iterdir()) == [target]


def test_a_full_disk_names_the_checkpoint_and_the_space_left(tmp_path):
    """torch.save's own error on a full disk (``RuntimeError: [enforce fail at inline_container.cc:...]``, raised
    while handling the file's ENOSPC) becomes the message, and the previous checkpoint stays whole."""
    target = tmp_path / "checkpoints" / "last.ckpt"
    writer = AtomicCheckpointIO()
    writer.save_checkpoint({"step": 1, "weights": torch.zeros(64)}, target)
    kept = target.read_bytes()
    writer.write = full_disk_write
    with pytest.raises(DiskFull) as error:
        writer.save_checkpoint({"step": 2, "weights": torch.ones(4096)}, target)
    assert re.fullmatch(rf"disk full while writing {re.escape(str(target))} \([0-9.]+ [kMG]?B(ytes)? left\): free "
                        r"space, then re-run the same command to resume", str(error.value))
    assert isinstance(error.value.__cause__, RuntimeError) and "inline_container" in str(error.value.__cause__)
    assert target.read_bytes() == kept and sorted(target.parent.iterdir()) == [target]


@pytest.mark.process
def test_a_real_full_disk_gives_the_same_message(tmp_path):
    """On a 64 kB tmpfs (a private mount namespace): torch.save of a 400 kB checkpoint fills it."""
    mount = tmp_path / "small_disk"
    mount.mkdir()
    script = (f"import torch; from lra.runtime.checkpoints import AtomicCheckpointIO; "
              f"AtomicCheckpointIO().save_checkpoint({{'weights': torch.zeros(100_000)}}, '{mount}/last.ckpt')")
    command = f"mount -t tmpfs -o size=64k none {mount} && {shlex.quote(sys.executable)} -c {shlex.quote(script)}"
    result = subprocess.run(["unshare", "-rm", "sh", "-c", command], capture_output=True, text=True, cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"})
    if "Traceback" not in result.stderr:  # python never ran: no namespace or mount rights here
        pytest.skip(f"needs `unshare -rm` and a tmpfs mount ({result.stderr.strip()[:200]})")
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"DiskFull: disk full while writing {mount}/last.ckpt (" in result.stderr
    assert "left): free space, then re-run the same command to resume" in result.stderr


@pytest.mark.parametrize("content", [b"PK\x03\x04 cut short", b"not a checkpoint\n"])
def test_an_unreadable_checkpoint_is_named(content, tmp_path):
    path = tmp_path / "last.ckpt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"{path} is not a readable checkpoint"):
        read_checkpoint(path)


def test_only_keys_that_cannot_change_the_result_may_differ():
    run = {"seed": 0, "optimizer": {"lr": 1e-4}, "logger": {"csv": {}}, "paths": {"output_dir": "a"},
           "callbacks": {"progress": {"refresh_rate": 10}}, "trainer": {"max_steps": 6, "log_every_n_steps": 10}}
    rerun = {"seed": 0, "optimizer": {"lr": 1e-3}, "logger": None, "paths": {"output_dir": "b"},
             "callbacks": {"progress": {"refresh_rate": 1}}, "trainer": {"max_steps": 8, "log_every_n_steps": 1}}
    assert settings_differences(run, rerun) == [("optimizer.lr", 1e-4, 1e-3), ("trainer.max_steps", 6, 8)]


def test_a_damaged_data_file_is_named_and_blank_lines_are_counted(tmp_path, caplog):
    path = tmp_path / "basic_train.tsv"
    path.write_bytes(f"{HEADER}\n( [MAX 1 2 ]\t2\n\n( [MIN 3 \xff ]\t3\n".encode("latin-1"))
    with pytest.raises(ValueError, match=f"{path}:4: not UTF-8 text"):
        read_tsv(path)
    path.write_text(f"{HEADER}\n( [MAX 1 2 ]\t2\n\n( [MIN 3 4 ]\t3\n")
    assert read_tsv(path)[1] == [2, 3]
    assert f"{path}: skipped 1 blank line(s) (line 3)" in caplog.text


def test_landmarks_that_cover_every_token_are_noted(capsys, tmp_path):
    note_exact_landmarks(compose_config(["attention=nystromformer", "attention.num_landmarks=500"], tmp_path))
    assert "attention.num_landmarks=500 >= task.max_length=200" in capsys.readouterr().out



def read_only_mount_works(folder: Path) -> bool:
    probe = f"mount --bind {folder} {folder} && mount -o remount,ro,bind {folder} && ! touch {folder}/x"
    return shutil.which("unshare") is not None and subprocess.run(["unshare", "-m", "sh", "-c", probe],
                                                                  capture_output=True).returncode == 0


@pytest.mark.process
def test_a_read_only_run_dir_is_named_before_anything_runs(tiny_listops_overrides, tmp_path):
    mount = tmp_path / "mount"
    mount.mkdir()
    if not read_only_mount_works(mount):
        pytest.skip("needs `unshare -m` and mount rights (a private read-only bind mount)")
    command = shlex.join([sys.executable, "-m", "lra.train", *tiny_listops_overrides, f"hydra.run.dir={mount / 'run'}"])
    result = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind {mount} {mount} && "
                             f"mount -o remount,ro,bind {mount} && {command}"], capture_output=True, text=True,
                            cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"cannot write the output dir {mount / 'run'} (hydra.run.dir): Read-only file system" in result.stderr
    assert "Unable to configure handler" not in result.stdout + result.stderr
    assert not any(mount.iterdir()) and not (tmp_path / "cache").exists()


def test_an_unwritable_sweep_dir_is_named_before_any_job_runs(tiny_listops_overrides, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    result = run_in_process(["-m", "lra.train", "-m", *tiny_listops_overrides, "seed=0,1",
                             f"hydra.sweep.dir={blocker / 'sweep'}"])
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"cannot write the output dir {blocker / 'sweep'} (hydra.sweep.dir): Not a directory" in result.stderr
    assert blocker.read_text() == "not a folder" and not (tmp_path / "cache").exists()


@pytest.mark.process
def test_a_full_disk_at_start_up_is_one_failed_line(tiny_listops_overrides, tmp_path):
    """A run dir on a disk that is full before the start (a 64 kB tmpfs, filled, in a private mount namespace)."""
    mount = tmp_path / "full"
    mount.mkdir()
    if not read_only_mount_works(tmp_path / "full"):
        pytest.skip("needs `unshare -m` and mount rights (a private tmpfs)")
    command = shlex.join([sys.executable, "-m", "lra.train", *tiny_listops_overrides, f"hydra.run.dir={mount / 'run'}"])
    result = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {mount} && "
                             f"(dd if=/dev/zero of={mount}/fill bs=4k || true) && {command}; code=$?; ls -A {mount}; "
                             "exit $code"], capture_output=True, text=True, cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"})
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"[lra] FAILED: cannot write the output dir {mount / 'run'} (hydra.run.dir): No space left on device. Nothing "
        "was run. Choose a writable dir (hydra.run.dir=<dir>, or paths.log_dir=<dir>) or make this one writable "
        "(read-only mount? full disk? a file in the path?)")
    assert "Traceback" not in result.stdout + result.stderr and "OSError" not in result.stderr
    assert result.stdout.split() == ["fill"]  # no run dir, no lock file left on that disk


def test_a_run_recorded_with_lightnings_checkpoint_class_still_resumes():
    """Runs recorded before the best checkpoint became lra.runtime.callbacks.RelocatableCheckpoint resume as before."""
    cfg = compose_config(["task=listops_small"], "/tmp/run")
    current = OmegaConf.to_container(cfg, resolve=False)
    old = OmegaConf.to_container(cfg, resolve=False)
    old["callbacks"]["checkpoint"]["_target_"] = "lightning.pytorch.callbacks.ModelCheckpoint"
    assert current["callbacks"]["checkpoint"]["_target_"] == "lra.runtime.callbacks.RelocatableCheckpoint"
    assert settings_differences(old, current) == []
    old["callbacks"]["checkpoint"]["mode"] = "min"
    assert settings_differences(old, current) == [("callbacks.checkpoint.mode", "min", "max")]


def test_relocated_moves_only_the_paths_under_the_old_checkpoint_dir():
    from lra.runtime.callbacks import relocated

    state = {"dirpath": "/a/run/checkpoints", "best_model_path": "/a/run/checkpoints/best-4.ckpt", "kth_best_model_path": "",
             "last_model_path": "/a/run/checkpoints/last.ckpt", "best_k_models": {"/a/run/checkpoints/best-4.ckpt": 0.5},
             "best_model_score": 0.5}
    moved = relocated(state, "/a/run/checkpoints/", "/b/copy/checkpoints")
    assert moved == {"dirpath": "/b/copy/checkpoints", "best_model_path": "/b/copy/checkpoints/best-4.ckpt",
                     "kth_best_model_path": "", "last_model_path": "/b/copy/checkpoints/last.ckpt",
                     "best_k_models": {"/b/copy/checkpoints/best-4.ckpt": 0.5}, "best_model_score": 0.5}
    assert relocated({"best_model_path": "/a/runner/best-1.ckpt"}, "/a/run", "/b")["best_model_path"] == "/a/runner/best-1.ckpt"
