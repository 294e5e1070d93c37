"""The console's progress bar (``callbacks.progress``, configs/callbacks/default.yaml): one bar over a stage's
optimizer steps, one line per evaluation.

A run is defined in steps (``trainer.max_steps``), not epochs, so the bar counts ``global_step`` up to
``max_steps``: ``train: 33%|███▎ | 500/1500 [01:02<02:04, 8.02step/s, loss=2.29, acc=0.188]``. The
self-pretraining stage (:mod:`lra.pretrain`) gets its own bar, named ``pretrain``. A resumed run's bar starts at
the restored step (tqdm's ``initial``), so its rate and time left count only the steps trained since. The rate is
the average since the bar started (tqdm ``smoothing=0``), evaluations included, so the time left includes the
evaluations still to come at the same share of the run.

Validation during training draws no bar of its own: the training bar's postfix says ``validating k/n`` and,
when it ends, one line is printed above the bar: ``[lra] step 500/1500: val/acc 0.1760, val/acc_best 0.1760``
(every ``val/*`` metric). Testing (and validation outside ``fit``) draws a bar that is erased when it ends.
Everything goes to stdout; only global rank 0 draws (Lightning disables the bar elsewhere).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import lightning as L
from lightning.pytorch.callbacks.progress import ProgressBar
from tqdm import tqdm

VALIDATION_PREFIX = "val/"  # the metrics an evaluation line prints (lra.module logs val/acc, val/acc_best)


class StepProgressBar(ProgressBar):
    """One tqdm bar per training stage over its optimizer steps, an evaluation line per validation, a
    short-lived bar for testing (module docstring). ``refresh_rate``: steps (and validation batches) between
    redraws; a log file gets ``max_steps / refresh_rate`` updates of the bar's line."""

    def __init__(self, refresh_rate: int = 10):
        super().__init__()
        if isinstance(refresh_rate, bool) or not isinstance(refresh_rate, int) or refresh_rate < 1:
            raise ValueError(f"callbacks.progress.refresh_rate must be an integer >= 1 (got {refresh_rate!r}): the "
                             "steps between redraws of the bar, e.g. callbacks.progress.refresh_rate=10")
        self.refresh_rate = refresh_rate
        self.enabled = True
        self.train_bar: tqdm | None = None  # open during fit
        self.eval_bar: tqdm | None = None   # open during test, or a validation outside fit
        self.eval_batches = 0               # batches of the current validation so far

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """A line above the bars (tqdm clears them, prints the line and redraws them)."""
        tqdm.write(sep.join(map(str, args)), file=sys.stdout)

    def stage_bar(self, trainer: L.Trainer, pl_module: L.LightningModule) -> tqdm:
        """The stage's bar: ``global_step`` of ``max_steps``, named by the module's ``stage_name`` (``train``
        where it has none)."""
        if trainer.max_steps < 1:
            raise ValueError(f"{type(self).__name__} counts a run's optimizer steps up to trainer.max_steps, which is "
                             f"{trainer.max_steps}: set trainer.max_steps (e.g. trainer.max_steps=1500)")
        return tqdm(desc=getattr(pl_module, "stage_name", "train"), total=trainer.max_steps,
                    initial=trainer.global_step, unit="step", file=sys.stdout, dynamic_ncols=True, smoothing=0)

    @staticmethod
    def transient_bar(description: str, batches: list[int | float] | int | float) -> tqdm:
        total = sum(batches) if isinstance(batches, list) else batches
        return tqdm(desc=description, total=total if math.isfinite(total) else None, unit="batch", file=sys.stdout,
                    dynamic_ncols=True, leave=False)

    def train_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """The progress-bar metrics but the logger's version and the validation metrics (on their own line), named
        without their stage (``train/loss`` -> ``loss``) to leave the bar room in 80 columns."""
        return {key.rsplit("/", 1)[-1]: value for key, value in self.get_metrics(trainer, pl_module).items()
                if key != "v_num" and not key.startswith(VALIDATION_PREFIX)}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.enabled:  # after a resume restored global_step
            self.train_bar = self.stage_bar(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if self.train_bar is not None:
            step = trainer.global_step
            if step - self.train_bar.n >= self.refresh_rate or step >= trainer.max_steps:
                self.advance(trainer, pl_module)

    def advance(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The training bar at ``global_step``, with the latest training metrics."""
        self.train_bar.set_postfix(self.train_metrics(trainer, pl_module), refresh=False)
        self.train_bar.update(trainer.global_step - self.train_bar.n)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.train_bar is not None:
            self.train_bar.close()
            self.train_bar = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled or trainer.sanity_checking:
            return
        self.eval_batches = 0
        if self.train_bar is None:
            self.eval_bar = self.transient_bar("validate", trainer.num_val_batches)
        else:
            self.advance(trainer, pl_module)  # a validation step need not be a multiple of refresh_rate
            self.train_bar.set_postfix_str(f"validating 0/{self.total_val_batches}")

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if not self.enabled or trainer.sanity_checking:
            return
        self.eval_batches += 1
        if self.eval_bar is not None:
            self.eval_bar.update(1)
        elif self.train_bar is not None and self.eval_batches % self.refresh_rate == 0:
            self.train_bar.set_postfix_str(f"validating {self.eval_batches}/{self.total_val_batches}")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled or trainer.sanity_checking:
            return
        self.close_eval_bar()
        if self.train_bar is not None:
            self.train_bar.set_postfix(self.train_metrics(trainer, pl_module), refresh=False)
            self.print(evaluation_line(trainer))

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.enabled:
            self.eval_bar = self.transient_bar("test", trainer.num_test_batches)

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        if self.eval_bar is not None:
            self.eval_bar.update(1)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.close_eval_bar()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """Leave the bars where they stopped, so the error is printed below them."""
        self.close_eval_bar()
        self.on_train_end(trainer, pl_module)

    def close_eval_bar(self) -> None:
        if self.eval_bar is not None:
            self.eval_bar.close()
            self.eval_bar = None


def evaluation_line(trainer: L.Trainer) -> str:
    """``[lra] step 500/1500: val/acc 0.1760, val/acc_best 0.1760``: every ``val/*`` metric after a validation."""
    metrics = ", ".join(f"{key} {float(value):.4f}" for key, value in sorted(trainer.callback_metrics.items())
                        if key.startswith(VALIDATION_PREFIX))
    return f"[lra] step {trainer.global_step}/{trainer.max_steps}: {metrics}"
