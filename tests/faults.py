"""Fault injection for end-to-end tests: ``+callbacks.faults._target_=tests.faults.Faults`` on the command line,
the fault chosen by an environment variable, so the faulty run and its re-run have the same settings (a resume
with other settings is refused):

- ``LRA_FAULT_SIGKILL_AT=<step>``: SIGKILL this process after that optimizer step (OOM killer, lost node);
- ``LRA_FAULT_SIGTERM_AT=<step>``: SIGTERM it (preemption; Lightning stops after the step);
- ``LRA_FAULT_ENOSPC_AT=<step>``: from that step on the disk is full: every checkpoint save writes part of the
  file, then fails with ``OSError(ENOSPC)``.
"""

from __future__ import annotations

import errno
import os
import signal

import lightning as L


def fault_step(name: str) -> int | None:
    value = os.environ.get(f"LRA_FAULT_{name}_AT")
    return int(value) if value else None


def full_disk_write(checkpoint, tmp) -> None:
    """What a full disk does to a write: some bytes land, then ENOSPC."""
    with open(tmp, "wb") as handle:
        handle.write(b"PK\x03\x04" + b"\0" * 1000)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))


class Faults(L.Callback):
    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        step = trainer.global_step
        if step == fault_step("SIGKILL"):
            os.kill(os.getpid(), signal.SIGKILL)
        if step == fault_step("SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
        if step == fault_step("ENOSPC"):
            trainer.strategy.checkpoint_io.write = full_disk_write
