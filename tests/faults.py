"""Fault injection for end-to-end tests: ``+callbacks.faults._target_=tests.faults.Faults`` on the command line,
the fault chosen by an environment variable, so the faulty run and its re-run have the same settings (a resume
with other settings is refused):

- ``LRA_FAULT_SIGKILL_AT=<step>``: SIGKILL this process after that optimizer step (OOM killer, lost node);
- ``LRA_FAULT_SIGSTOP_AT=<step>``: SIGSTOP it (a run paused mid-training: its run dir stays in use);
- ``LRA_FAULT_SIGTERM_AT=<step>``: SIGTERM it (preemption; Lightning stops after the step);
- ``LRA_FAULT_SIGINT_AT=<step>``: SIGINT it (Ctrl-C; stopped as by SIGTERM);
- ``LRA_FAULT_SIGINT_TWICE_AT=<step>``: SIGINT it twice (Ctrl-C pressed again: it stops at once);
- ``LRA_FAULT_SIGINT_IN_VALIDATION_AT=<step>``: SIGINT it during the validation after that step (after its first
  batch);
- ``LRA_FAULT_SIGINT_IN_TEST_AT=<batch>``: SIGINT it during the final test, after that test batch;
- ``LRA_FAULT_ERROR_AT=<step>``: raise ``RuntimeError`` in the middle of the step after that one (its batch
  fetched, not trained: an out-of-memory, a bug);
- ``LRA_FAULT_ENOSPC_AT=<step>``: from that step on the disk is full: every checkpoint save writes part of the
  file, then the file's write fails with ``OSError(ENOSPC)``, which ``torch.save`` reports as its ``RuntimeError``.
"""

from __future__ import annotations

import errno
import io
import os
import signal

import lightning as L
import torch


def fault_step(name: str) -> int | None:
    value = os.environ.get(f"LRA_FAULT_{name}_AT")
    return int(value) if value else None


class FullDiskFile(io.FileIO):
    """A file on a disk with room for 1,000 more bytes: a write beyond them fails with ENOSPC, as a full disk's."""

    def write(self, data) -> int:
        if self.tell() + len(data) > 1000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)
        return super().write(data)


def full_disk_write(checkpoint, tmp) -> None:
    """``AtomicCheckpointIO.write`` on a full disk: the real ``torch.save``, into a file that runs out of room."""
    with FullDiskFile(tmp, "wb") as handle:
        torch.save(checkpoint, handle)


def send(signum: int) -> None:
    """``signum`` to this process. A Python call: entering it runs the handler of a signal sent before, so two
    signals in a row reach the handler twice (the interpreter would run it once for both)."""
    os.kill(os.getpid(), signum)


class Faults(L.Callback):
    def on_train_batch_start(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == fault_step("ERROR"):
            raise RuntimeError(f"fault injected in the middle of step {trainer.global_step + 1}")

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        step = trainer.global_step
        if step == fault_step("SIGKILL"):
            send(signal.SIGKILL)
        if step == fault_step("SIGSTOP"):
            send(signal.SIGSTOP)
        if step == fault_step("SIGTERM"):
            send(signal.SIGTERM)
        if step == fault_step("SIGINT"):
            send(signal.SIGINT)
        if step == fault_step("SIGINT_TWICE"):
            send(signal.SIGINT)
            send(signal.SIGINT)
        if step == fault_step("ENOSPC"):
            trainer.strategy.checkpoint_io.write = full_disk_write

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int, *args) -> None:
        if trainer.state.fn == "fit" and batch_idx == 0 and trainer.global_step == fault_step("SIGINT_IN_VALIDATION"):
            send(signal.SIGINT)

    def on_test_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int, *args) -> None:
        if batch_idx == fault_step("SIGINT_IN_TEST"):
            send(signal.SIGINT)
