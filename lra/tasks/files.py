"""File helpers shared by the task readers: cache-key fingerprints, atomic writes, inter-process locks."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from filelock import FileLock, Timeout

log = logging.getLogger(__name__)


def file_fingerprint(path: Path) -> list[int] | None:
    """``[size, mtime_ns]`` of ``path``, None when it is missing: part of a cache key, so a file edited in
    place (even to the same size) or replaced rebuilds the cache. **Decision:** mtime + size, not a content
    hash: hashing the multi-GB Pathfinder / AAN data on every start costs minutes; tools that copy a file
    with its old mtime *and* change its content (rare) need ``rm -r data/cache``."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return [stat.st_size, stat.st_mtime_ns]


def file_mode(path: Path) -> int:
    """The permissions ``path`` has, or those a plain ``open`` would give a new file (0666 less the umask)."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write(path: Path, write) -> None:
    """``write(tmp_path)`` into a temporary file unique to this call beside ``path``, flush it to disk (``fsync``),
    then ``os.replace`` it onto ``path``: concurrent writers never share a temporary file, a reader sees the old or
    the new file, whole, and no file is ever half-written under ``path`` (a full disk or a kill mid-write leaves
    the old file). A write that fails removes its temporary file and raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        os.chmod(tmp, file_mode(path))  # mkstemp's 0600 would hide the file from the group
        write(Path(tmp))
        with open(tmp, "rb+") as written:
            os.fsync(written.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # the rename itself survives a crash once the directory is synced too
        directory = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(directory)
    except OSError:
        pass
    finally:
        os.close(directory)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def locked(path: Path, waiting_for: str) -> FileLock:
    """An acquired inter-process lock on ``path`` (released when the ``with`` block ends, or when the process
    dies: it is an ``fcntl`` lock); logs once if another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("waiting for another process %s (lock %s)", waiting_for, path)
        lock.acquire()
    return lock


# --- resumable training order ------------------------------------------------------------------------
