"""One process per run dir: an ``fcntl.flock`` on ``<dir>/owner.lock``.

The lock is taken before anything is written into the dir and held until the process ends; the operating system
releases it when the process dies, however it dies, so a killed run never leaves a stale lock (the file stays,
holding the last owner's pid, command and host, read only while the lock is held). A second process refuses with
:class:`RunDirInUse`, naming the holder and the dir, before it writes anything there.

Where it is taken (:class:`RunDirOwner`, a Hydra callback, runs before Hydra writes ``.hydra/`` and opens its log):

- a single run locks ``hydra.run.dir``, and refuses a dir inside a dir another process holds (a job dir of a
  running sweep);
- a sweep locks ``hydra.sweep.dir`` and refuses when a dir under it (a job dir) is held by another process; each
  job then locks its own dir when it starts (``lra.runtime.job.run_job``), so a job of another launcher (joblib, SLURM: other
  processes) owns its dir too. There Hydra has already written the job's ``.hydra/`` and opened its log; only a
  process that is not a sweep of this dir can hold a job dir by then, and the checks above refuse those.

Only rank 0 locks: the other DDP ranks of a run share its dir.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from lra.runtime.hydra_callbacks import require_writable, unwritable

LOCK_FILE = "owner.lock"
held: dict[Path, int] = {}  # dir -> file descriptor holding its lock, in this process


class RunDirInUse(SystemExit):
    """Another process holds the dir; nothing in it was written."""


def absolute(directory) -> Path:
    """``directory`` as Hydra names a job's output dir (``os.path.abspath``: ``..`` resolved, links kept), so the
    Hydra callback and the job agree on which dir this process holds."""
    return Path(os.path.abspath(str(directory)))


def holder_of(lock: Path) -> str:
    """The holder's record in ``lock``: pid, host, start time and command."""
    try:
        record = json.loads(lock.read_text())
        return (f"pid {record['pid']} on {record['host']} (started {record['started']}), "
                f"command: {record['command']}")
    except (OSError, ValueError, KeyError):
        return "another process (it has not recorded itself yet)"


def held_by_another(lock: Path) -> bool:
    """Whether another process holds ``lock`` (a lock file that does not exist is held by nobody). A probe: it takes
    and drops a shared lock, and creates nothing."""
    try:
        descriptor = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)  # drops the probe's lock


def refusal(directory: Path, key: str, lock: Path) -> RunDirInUse:
    """The refusal of ``directory`` (config key ``key``) because another process holds ``lock``: the dir's own lock,
    one of a dir around it, or one of a dir under it."""
    if lock.parent == directory:
        where = ""
    elif directory in lock.parents:
        where = f" (a dir under it, {lock.parent}, is in use)"
    else:
        where = f" (it lies inside {lock.parent}, which is in use)"
    return RunDirInUse(
        f"[lra] IN USE: {directory} ({key}) belongs to another running process{where}: {holder_of(lock)}. "
        f"Nothing was written there. Wait for it to end, or stop it (Ctrl-C or kill; re-running its command "
        f"resumes it), or train into another dir (drop {key}, or give another one)")


def hold(directory: Path, key: str) -> bool:
    """Make this process the owner of ``directory`` (rank 0 only), or raise :class:`RunDirInUse` naming the holder.
    True when this call took the lock, False when this process already held it (or is not rank 0)."""
    directory = absolute(directory)
    if rank_zero_only.rank != 0 or directory in held:
        return False
    directory.mkdir(parents=True, exist_ok=True)
    lock = directory / LOCK_FILE
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise refusal(directory, key, lock) from None
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": shlex.join(sys.orig_argv)}
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, json.dumps(record).encode(), 0)
    held[directory] = descriptor
    return True


def release(directory: Path) -> None:
    """Give up this process's lock on ``directory`` (a sweep's jobs, run one after another in one process)."""
    descriptor = held.pop(absolute(directory), None)
    if descriptor is not None:
        os.close(descriptor)


def refuse_if_held(directory: Path, key: str, locks) -> None:
    """Raise :class:`RunDirInUse` when another process holds one of ``locks``."""
    for lock in locks:
        if held_by_another(lock):
            raise refusal(absolute(directory), key, lock)


class RunDirOwner(Callback):
    """Lock the run dir (a single run) or the sweep dir (a multirun) before Hydra writes anything there: first in
    ``hydra.callbacks``, it probes the dirs around it (reading only), then checks that the dir can be written
    (:func:`lra.runtime.hydra_callbacks.require_writable`, which makes it), then locks it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.own(absolute(config.hydra.run.dir), "hydra.run.dir", below=False)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.own(absolute(config.hydra.sweep.dir), "hydra.sweep.dir", below=True)

    @staticmethod
    def own(directory: Path, key: str, below: bool) -> None:
        if rank_zero_only.rank != 0:
            return
        refuse_if_held(directory, key, [parent / LOCK_FILE for parent in directory.parents])
        require_writable(directory, key)
        try:
            hold(directory, key)
        except OSError as error:  # a disk that filled up since the check
            raise unwritable(directory, key, error) from None
        if below:
            refuse_if_held(directory, key, directory.glob(f"*/**/{LOCK_FILE}"))
