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


def atomic_write(path: Path, write) -> None:
    """``write(tmp_path)`` into a temporary file unique to this call beside ``path``, then ``os.replace`` it onto
    ``path``: concurrent writers never share a temporary file and a reader sees the old or the new file, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
