"""Lightning callbacks (configs/callbacks/*.yaml): LiZA's memory-gate schedule; checkpoints and checks of every run."""

from __future__ import annotations

import os
import warnings
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lra.runtime.interrupts import StoppedAtOnce

GATE_BUFFER = "memory_gate"  # name of the μ buffer of attention.liza.LiZAAttention (scheduled gate)


class MemoryGateSchedule(L.Callback):
    """LiZA's memory-as-gate schedule (TPTT §4.2): μ ramps linearly ``start → end`` over ``ramp_steps``
    optimizer steps, then stays at ``end``.

    ``μ(step) = start + (end − start) · min(step, ramp_steps) / ramp_steps`` (``ramp_steps = 0``: ``end``
    from the start; ``start = end``: a constant μ). Before every training batch it writes μ(global_step)
    into every module's ``memory_gate`` buffer and logs it as ``train/mag``. Modules without that buffer
    (other variants, LiZA with a learned gate) are left alone, so the callback is a no-op for them.
    """

    def __init__(self, start: float = 0.01, end: float = 0.5, ramp_steps: int = 100):
        if not (0.0 <= start <= 1.0 and 0.0 <= end <= 1.0):
            raise ValueError(f"callbacks.memory_gate.start/end must lie in [0, 1], got {start}, {end}")
        if ramp_steps < 0:
            raise ValueError(f"callbacks.memory_gate.ramp_steps must be >= 0, got {ramp_steps}")
        self.start = start
        self.end = end
        self.ramp_steps = ramp_steps

    def value_at(self, step: int) -> float:
        """μ after ``step`` optimizer steps."""
        if self.ramp_steps == 0:
            return self.end
        return self.start + (self.end - self.start) * min(step, self.ramp_steps) / self.ramp_steps

    @staticmethod
    def gates(module: torch.nn.Module) -> list[torch.Tensor]:
        """Every ``memory_gate`` buffer under ``module``."""
        return [buffers[GATE_BUFFER] for m in module.modules() if GATE_BUFFER in (buffers := dict(m.named_buffers(recurse=False)))]

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        gates = self.gates(pl_module)
        if not gates:
            return
        mu = self.value_at(trainer.global_step)
        for gate in gates:
            gate.fill_(mu)
        pl_module.log("train/mag", mu, on_step=True, on_epoch=False)


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite (raised by :class:`StopOnNonFiniteLoss`)."""


class StopOnNonFiniteLoss(L.Callback):
    """Stop the run as failed, naming the step, as soon as the training loss is NaN or infinite.

    After a NaN loss every later step is NaN too, so training on would only waste time and end in a
    run that looks completed. :class:`LastCheckpoint` does not save such a model.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and not torch.isfinite(loss).all():
            lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
            raise NonFiniteLossError(
                f"train/loss is {float(loss)} at step {trainer.global_step} (lr {lr:.3g}): training diverged. "
                "Lower optimizer.lr, or clip gradients with trainer.gradient_clip_val=1.0"
            )


class ValidateLastStep(L.Callback):
    """Validate at ``trainer.max_steps`` too, whether or not it is a multiple of ``val_check_interval``
    (``task.eval_every``), so every run ends evaluated and its last step competes for the best checkpoint.

    A run shorter than ``task.eval_every`` (``trainer.max_steps=20`` with ``eval_every: 250``) then
    validates once, at step 20, and tests that checkpoint. It asks Lightning to stop after the last
    step (``trainer.should_stop``), which validates the step as an early stop does; a step that was
    due for validation anyway is validated once.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True


def relocated(state: dict[str, Any], old_dir: str, new_dir: str) -> dict[str, Any]:
    """A ``ModelCheckpoint`` state whose paths under ``old_dir`` are moved to ``new_dir`` (the same name relative
    to it); paths elsewhere are kept. Lightning stores them absolute, so a run dir that was moved or copied would
    otherwise test (and compare scores against) the checkpoints of where it was."""
    old_dir = os.path.normpath(old_dir)

    def move(path):
        try:
            inside = bool(path) and os.path.commonpath([old_dir, os.path.normpath(path)]) == old_dir
        except ValueError:  # one absolute, one relative: not under it
            inside = False
        return os.path.join(new_dir, os.path.relpath(os.path.normpath(path), old_dir)) if inside else path

    state = dict(state, dirpath=new_dir)
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in state:
            state[key] = move(state[key])
    if "best_k_models" in state:
        state["best_k_models"] = {move(path): score for path, score in state["best_k_models"].items()}
    return state


class RelocatableCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` for a run dir that may be moved between a stop and its resume: the restored
    state's paths (best, k-th best, last) are read relative to the checkpoint dir as it is now (:func:`relocated`),
    so the best score and its file carry over (Lightning itself drops the best score when ``dirpath`` changed, and
    the resumed run then tests a later, worse checkpoint). Lightning's "Checkpoint directory ... exists and is not
    empty" warning is not given: a run dir holding checkpoints is resumed or refused (:mod:`lra.runtime.run_dir`)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
            super().setup(trainer, pl_module, stage)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        old_dir = state_dict.get("dirpath")
        if old_dir and self.dirpath and os.path.normpath(old_dir) != os.path.normpath(self.dirpath):
            state_dict = relocated(state_dict, old_dir, self.dirpath)
        super().load_state_dict(state_dict)


class LastCheckpoint(RelocatableCheckpoint):
    """``last.ckpt`` after every validation, at the end of training, and on SIGTERM or Ctrl-C
    (``interrupted-<step>.ckpt`` beside it); re-running into the run dir resumes from it.

    Saved after the validation of its step (Lightning's step-based saving comes before it), so the best
    checkpoint it names still exists; keep it after the best-checkpoint callback in the config. Not saved on
    an error (a NaN loss, an out-of-memory, a second Ctrl-C): it lands in the middle of a step, whose state counts
    the step in flight on one side and not on the other, so a resume from it would be off by one step; the re-run
    resumes from the last checkpoint saved whole instead.
    Lightning's ``save_last`` on a monitored checkpoint only writes when the score improves, hence this class.
    """

    def __init__(self, dirpath: str, filename: str = "interrupted-{step}"):
        super().__init__(dirpath=dirpath, filename=filename, save_top_k=0, save_last=True, save_on_exception=True,
                         auto_insert_metric_name=False, enable_version_counter=False)

    def on_train_batch_end(self, *args, **kwargs) -> None:
        """Nothing: saved after the step's validation instead."""

    def on_train_epoch_end(self, *args, **kwargs) -> None:
        """Nothing: epochs do not matter here (``val_check_interval`` counts steps across epochs)."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Save the state of the finished fit, even where the last step's validation saved that step: a resume of
        a run stopped later (during its test) restores the loops' end-of-fit counters (epoch, logged step), which
        the test's ``metrics.csv`` row reads; a checkpoint of the step's validation holds them one step short."""
        if not trainer.fast_dev_run:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.training_started = True  # after any resume has restored its checkpoint and the loader's position

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """Save the state trained so far on a graceful stop (SIGTERM or a first Ctrl-C: Lightning raises
        ``SIGTERMException`` between steps, :mod:`lra.runtime.interrupts`), but only once training ran: a stop while a
        checkpoint is restored would otherwise overwrite the run's checkpoints with a fresh model. A save that
        fails (a full disk) is reported and leaves the older checkpoints as they were."""
        graceful = isinstance(exception, SIGTERMException) and not isinstance(exception, StoppedAtOnce)
        if not graceful or not getattr(self, "training_started", False) or trainer.state.fn != TrainerFn.FITTING:
            return  # a stop during the final test: fit's last.ckpt is whole; the test has loaded the best weights
        try:
            super().on_exception(trainer, pl_module, exception)
        except OSError as error:
            print(f"[lra] the interrupted-<step>.ckpt / last.ckpt of step {trainer.global_step} not saved "
                  f"({type(error).__name__}: {error}); the older checkpoints are kept", flush=True)
