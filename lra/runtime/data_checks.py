"""The data and the run dir checked once the data is loaded and a resume restored, before the first training step
(:class:`DataChecks`, a callback :func:`lra.train.train` adds), and what a run dir whose checkpoints are gone
restarts from (:func:`note_lost_checkpoints`).

- every label lies in ``[0, task.num_classes)`` and every token id in ``[0, task.vocab_size)``: the model's head and
  embedding are sized by these keys, and a mismatch would be an ``IndexError`` at step 1 naming neither;
- the data is the data the resumed checkpoint trained on (:func:`lra.tasks.splits.data_fingerprint`, kept in each
  checkpoint and in ``results.json`` as ``data_fingerprint``); a resume on changed data is refused unless
  ``accept_changed_data=true``;
- the best checkpoint a resumed run will test still exists (else it would train to the end, then fail).
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L

from lra.tasks.splits import data_fingerprint


class DataChecks(L.Callback):
    """The checks of the module docstring at ``on_fit_start`` (after Lightning's setup and checkpoint restore)."""

    def __init__(self, num_classes: int, vocab_size: int, accept_changed_data: bool = False):
        self.num_classes, self.vocab_size, self.accept_changed_data = num_classes, vocab_size, accept_changed_data

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datamodule = trainer.datamodule
        splits = getattr(datamodule, "splits", None)
        if splits:
            self.check_sizes(datamodule)
            datamodule.data_fingerprint = data_fingerprint(splits)
            self.check_resumed_data(datamodule)
        best = getattr(trainer.checkpoint_callback, "best_model_path", "")
        if best and not Path(best).is_file():
            raise FileNotFoundError(
                f"the run's best checkpoint {best} (the one its final test loads) is missing: put it back, or train "
                f"again in a new run dir (drop hydra.run.dir); nothing was trained")

    def check_sizes(self, datamodule) -> None:
        """Labels in ``[0, task.num_classes)``, token ids in ``[0, task.vocab_size)``, in every split."""
        for split, data in datamodule.splits.items():
            labels = int(data.labels.max())
            if labels >= self.num_classes:
                index = int((data.labels >= self.num_classes).nonzero()[0])
                raise ValueError(
                    f"{datamodule.example_source(split, index)}: label {int(data.labels[index])}, but "
                    f"task.num_classes={self.num_classes} (the model's classes; the {split} labels go up to {labels}): "
                    f"set task.num_classes={labels + 1}, or drop the override")
            tokens = int(data.ids.max())
            if tokens >= self.vocab_size:
                index = int((data.ids.view(len(data), -1) >= self.vocab_size).any(1).nonzero()[0])
                raise ValueError(
                    f"{datamodule.example_source(split, index)}: token id {int(data.ids[index].max())}, but "
                    f"task.vocab_size={self.vocab_size} (the model's embedding rows; the {split} ids go up to "
                    f"{tokens}): set task.vocab_size={tokens + 1} or more, or drop the override")

    def check_resumed_data(self, datamodule) -> None:
        old, new = datamodule.resumed_fingerprint, datamodule.data_fingerprint
        if old is None or old == new:
            return
        where = getattr(datamodule, "data_dir", "the data")
        if self.accept_changed_data:
            print(f"[lra] note: the data in {where} changed since the checkpoint this run resumes from (fingerprint "
                  f"{old[:12]} -> {new[:12]}); resuming on it (accept_changed_data=true)", flush=True)
            return
        raise ValueError(
            f"the data in {where} is not the data this run trained on (fingerprint {old[:12]} in its checkpoint, "
            f"{new[:12]} now: a file was edited or replaced since): a resume would continue on other data. Put the "
            f"data back, train in a new run dir (drop hydra.run.dir), or add accept_changed_data=true to resume on "
            f"this data anyway; nothing was trained")


def note_lost_checkpoints(run_dir: Path) -> None:
    """Say so when ``run_dir`` holds a run that trained (its ``results.json`` names a step > 0) but no checkpoint to
    resume from (``checkpoints/`` deleted or emptied): this run starts from step 0."""
    try:
        record = json.loads((Path(run_dir) / "results.json").read_text())
    except (OSError, ValueError):
        return
    if isinstance(record, dict) and record.get("status") != "completed" and (record.get("steps") or 0) > 0:
        print(f"[lra] note: {run_dir} holds a run {record.get('status')} at step {record['steps']}, but no checkpoint "
              f"({Path(run_dir) / 'checkpoints'} is missing or empty): training from step 0", flush=True)
