"""File helpers shared by the task readers: cache-key fingerprints, atomic writes, inter-process locks, a full disk."""

from __future__ import annotations

import errno
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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


def record_line(path: Path, index: int, header_lines: int = 0) -> int | None:
    """The line number (from 1) of the ``index``-th record of a text file of one record per non-blank line after
    ``header_lines`` lines, or None past its end: where a reader's example came from, for an error message (a
    scan of the file, run only then)."""
    with Path(path).open("rb") as handle:
        records = (number for number, line in enumerate(handle, start=1) if number > header_lines and line.strip())
        return next((number for k, number in enumerate(records) if k == index), None)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def locked(path: Path, waiting_for: str) -> FileLock:
    """An acquired inter-process lock on ``path`` (released when the ``with`` block ends, or when the process
    dies: it is an ``fcntl`` lock); logs once if another process holds it. Its folder is made (again, when a
    failed build removed it while this process waited: :func:`building`)."""
    lock, waiting = FileLock(path), False
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            lock.acquire(timeout=-1 if waiting else 0)
            return lock
        except Timeout:
            log.info("waiting for another process %s (lock %s)", waiting_for, path)
            waiting = True
        except FileNotFoundError:  # the folder was removed between the mkdir and the lock: make it again
            continue


@contextmanager
def transient_lock(path: Path, waiting_for: str) -> Iterator[None]:
    """Hold :func:`locked` ``path`` while the body runs, and remove the lock file before releasing it (while held:
    nobody else holds it), so a lock beside what it guards (a data dir being generated) leaves no file there. A
    process waiting on it meanwhile takes over a new lock file (filelock retries when the file it locked was
    unlinked)."""
    with locked(path, waiting_for):
        try:
            yield
        finally:
            path.unlink(missing_ok=True)


def remove_partial_writes(folder: Path, name: str = "*") -> list[Path]:
    """Remove the temporary files :func:`atomic_write` leaves in ``folder`` when its process is killed mid-write
    (``.<name>.<random>.tmp``; only those of ``name`` when given); returns them. Call it only where no other
    process can be writing (a run dir this process owns, a cache target whose lock it holds)."""
    removed = []
    for path in Path(folder).glob(f".{name}.*.tmp"):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


@contextmanager
def building(target: Path, waiting_for: str) -> Iterator[None]:
    """Hold the lock ``<target>.lock`` (:func:`locked`) while the body builds ``target``.

    A build that raises (a bad line in a data file, a SIGTERM) removes its lock file, and then ``target``'s folder
    when this call created it and nothing else is in it, so a failed first build leaves no lock-only folder behind.
    A folder holding anything else (another split's cache, another process's lock or temporary file) is kept
    whole; a process waiting on the lock meanwhile takes it over (filelock retries on an unlinked lock file, and
    :func:`locked` makes the folder again)."""
    folder, lock_path = target.parent, target.with_name(target.name + ".lock")
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir()  # atomic: of processes racing to make it, exactly one created it
        created = True
    except FileExistsError:
        created = False
    try:
        with locked(lock_path, waiting_for):
            try:
                yield
            except BaseException:
                lock_path.unlink(missing_ok=True)  # while held: nobody holds a lock on it
                raise
    except BaseException:
        if created:
            remove_if_empty(folder)
        raise


def remove_if_empty(folder: Path) -> None:
    """``rmdir`` ``folder`` unless something is in it (then it is in use, and kept)."""
    try:
        folder.rmdir()
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
            log.warning("could not remove the empty cache folder %s (%s)", folder, error)


def disk_full(error: BaseException | None) -> bool:
    """Whether ``error``, or one it was raised from or while handling, is a full disk or quota (``torch.save``
    reports one as ``RuntimeError: [enforce fail at inline_container.cc:...]``, raised while handling the ENOSPC)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        error = error.__cause__ or error.__context__
    return False
