"""``logger=csv``: one ``metrics.csv`` per run dir, which a resumed run continues.

Lightning's ``CSVLogger`` opens a new ``version_<n>/`` in every process, so a run interrupted and resumed had its
metrics split over ``version_0/metrics.csv`` and ``version_1/metrics.csv``; with a fixed version it deletes the
existing file instead. :class:`RunCSVLogger` always writes ``<run dir>/csv/version_0/metrics.csv`` (a run dir holds
one run) and continues it:

- every row is written when it is logged (a SIGKILL loses none), appended after the rows already there, which
  stay byte for byte; a metric column that appears later rewrites the file under the new header (atomically,
  its rows' values as they were, empty in the new column);
- every checkpoint records how many rows the file held when it was saved (:class:`CSVRowsInCheckpoint`, which
  ``lra.runtime.trainer.build_trainer`` adds beside the logger), and a run resumed from it first cuts the file back to those
  rows: the steps trained after that checkpoint, which the resumed run trains again, are logged once.

**Decision:** rows, not steps, mark where a checkpoint stands: the self-pretraining stage and the supervised
stage log into the same file, both from step 0. A run that starts again from step 0 (killed before its first
checkpoint, or none of its checkpoints loads) keeps the rows of the lost attempt before its own.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import lightning as L
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.trainer.states import TrainerFn

from lra.tasks.files import atomic_write

ROWS_KEY = "csv_log_rows"  # in every checkpoint: how many rows metrics.csv held when it was saved


class ContinuedMetricsWriter(ExperimentWriter):
    """Lightning's metrics writer, continuing an existing ``metrics.csv`` (see the module docstring)."""

    def _check_log_dir_exists(self) -> None:
        """(Called by Lightning's ``__init__``, which deletes the file here.) Read the file's header and count its rows."""
        self.path = Path(self.metrics_file_path)
        lines = self.lines()
        self.header = next(csv.reader([line.decode() for line in lines[:1]]), [])
        self.metrics_keys = list(self.header)
        self.rows = max(len(lines) - 1, 0)

    def lines(self) -> list[bytes]:
        """The file's lines, header first (metric values hold no line breaks), or none when there is no file."""
        return self.path.read_bytes().splitlines(keepends=True) if self.path.is_file() else []

    def save(self) -> None:
        """Append the rows logged since the last save; the whole file again when the columns changed."""
        if not self.metrics:
            return
        self._record_new_keys()
        if self.metrics_keys != self.header:
            rows = list(csv.DictReader(io.StringIO(b"".join(self.lines()).decode()))) + self.metrics
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, fieldnames=self.metrics_keys)
            writer.writeheader()
            writer.writerows(rows)
            atomic_write(self.path, lambda tmp: tmp.write_bytes(text.getvalue().encode()))
            self.header = list(self.metrics_keys)
        else:
            with self.path.open("a", newline="") as handle:
                csv.DictWriter(handle, fieldnames=self.metrics_keys).writerows(self.metrics)
        self.rows += len(self.metrics)
        self.metrics = []

    def keep_rows(self, count: int, checkpoint: str) -> None:
        """Cut the file back to its first ``count`` rows (those logged before ``checkpoint`` was saved). No file (moved
        aside): the resumed run starts a new one."""
        if not self.path.is_file():
            if count:
                print(f"[lra] no {self.path}: a new one logs the steps after {checkpoint}", flush=True)
            self.header, self.rows = [], 0
            return
        if count > self.rows:
            raise ValueError(
                f"{self.path} holds {self.rows} rows, but {checkpoint} was saved when it held {count}: the log lost "
                f"rows since (deleted or edited). Put the full file back, or move it aside: the resumed run then "
                f"starts a new one")
        if count < self.rows:
            print(f"[lra] {self.path}: {self.rows - count} row(s) logged after {checkpoint} dropped; the resumed "
                  "run logs those steps again", flush=True)
            atomic_write(self.path, lambda tmp: tmp.write_bytes(b"".join(self.lines()[: count + 1])))
            self.rows = count


class RunCSVLogger(CSVLogger):
    """Lightning's ``CSVLogger`` with one ``version_0/metrics.csv`` per run dir that a resumed run continues
    (:class:`ContinuedMetricsWriter`); each row is written when it is logged."""

    def __init__(self, save_dir: str, name: str = "csv"):
        super().__init__(save_dir, name=name, version=0, flush_logs_every_n_steps=1)

    @property
    @rank_zero_experiment
    def experiment(self) -> ContinuedMetricsWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = ContinuedMetricsWriter(log_dir=self.log_dir)
        return self._experiment


class CSVRowsInCheckpoint(L.Callback):
    """Records in every checkpoint how many rows ``logger``'s file holds; a fit resumed from one cuts the file
    back to them (testing from a checkpoint leaves the file alone)."""

    def __init__(self, logger: RunCSVLogger):
        self.logger = logger

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if trainer.is_global_zero:
            self.logger.save()
            checkpoint[ROWS_KEY] = self.logger.experiment.rows

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if trainer.state.fn != TrainerFn.FITTING or not trainer.is_global_zero:
            return
        writer = self.logger.experiment
        if ROWS_KEY in checkpoint:
            writer.keep_rows(checkpoint[ROWS_KEY], trainer.ckpt_path)
        elif writer.rows:
            print(f"[lra] {trainer.ckpt_path} does not record how many rows {writer.path} held (saved without "
                  f"logger=csv or by an older version): its {writer.rows} rows are kept, so steps after that "
                  "checkpoint may be logged twice (the later row is the resumed run's)", flush=True)
