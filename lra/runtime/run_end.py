"""How a run that does not complete ends: its record in ``results.json``, its traceback in ``error.log``, and the
one line a user reads, printed last (:func:`lra.runtime.job.run_job` prints it after the loggers have closed).

A run may write its record only where it is the run dir's run (``owner``), or where the dir holds no checkpoints
(nothing to mix up): a run refused at the door leaves another run's record alone.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from omegaconf import DictConfig

from lra.runtime.checkpoints import DiskFull, is_disk_full
from lra.runtime.interrupts import STOPPING_SIGNALS, StoppedAtOnce, exit_code
from lra.runtime.results import read_results, write_results
from lra.runtime.run_dir import checkpoints

ERROR_LOG = "error.log"


class Progress:
    """What a run has done so far: its step and validation curve, read from the trainer and module until
    :meth:`fitted` fixes them (testing loads the best checkpoint, whose curve ends at its own step)."""

    def __init__(self, trainer, module):
        self.trainer, self.module, self.fit = trainer, module, None

    def fitted(self) -> list:
        """Fix the step and curve at the end of fit; return the curve."""
        self.fit = (self.trainer.global_step, list(self.module.val_curve))
        return self.fit[1]

    def now(self) -> tuple[int, list]:
        return self.fit if self.fit is not None else (self.trainer.global_step, list(self.module.val_curve))


@contextmanager
def recording_progress(trainer, module) -> Iterator[Progress]:
    """An exception leaving the block carries the step it stopped at (``error.step``) and the validation curve so
    far (``error.val_curve``): what the failed or interrupted record (:func:`failure`, :func:`interruption`) names.
    After fit, :meth:`Progress.fitted` keeps fit's: a stop during the test records all of fit's curve."""
    progress = Progress(trainer, module)
    try:
        yield progress
    except BaseException as error:
        error.step, error.val_curve = progress.now()
        raise


def may_write(run_dir: Path, owner: bool) -> bool:
    return owner or not checkpoints(run_dir)


def show_traceback(verbose) -> bool:
    """Whether the console gets the traceback too: ``verbose=true``, ``HYDRA_FULL_ERROR=1`` (Hydra's switch for
    it) or ``hydra.verbose=true`` (or a logger name)."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1" or bool(verbose)


def failure(run_dir: Path, cfg: DictConfig, error: Exception, owner: bool, verbose, **record) -> str:
    """Record ``error`` (``status: failed`` and ``error.log``; ``record``: more keys for ``results.json``) and return
    the ``[lra] FAILED:`` line."""
    details = "".join(traceback.format_exception(error))
    if show_traceback(verbose):
        print(details, end="", file=sys.stderr, flush=True)
    if not may_write(run_dir, owner):
        where = "nothing written: the run dir holds another run's checkpoints"
    else:
        where = write_error(run_dir, cfg, error, details, verbose, **record)
    fix = ("; free space there, then re-run the same command to resume"
           if is_disk_full(error) and not isinstance(error, DiskFull) else "")
    return f"[lra] FAILED: {type(error).__name__}: {error}{fix} ({where})"


def write_error(run_dir: Path, cfg: DictConfig, error: Exception, details: str, verbose, **record) -> str:
    """``error.log`` (the traceback) and ``results.json`` (``status: failed``); what was written, or why not."""
    try:
        write_results(run_dir, cfg, "failed", error=f"{type(error).__name__}: {error}", steps=getattr(error, "step", None),
                      val_curve=getattr(error, "val_curve", None), traceback=details, **record)
        (run_dir / ERROR_LOG).write_text(details)
    except OSError as write_error:  # a full disk: say so rather than hide the run's error behind this one
        if not show_traceback(verbose):
            print(details, end="", file=sys.stderr, flush=True)  # written nowhere else
        return f"its record not written: {type(write_error).__name__}: {write_error}"
    hint = "" if show_traceback(verbose) else "; verbose=true also prints it here"
    return f"traceback in {run_dir / ERROR_LOG}{hint}; record in {run_dir / 'results.json'}"


def interruption(run_dir: Path, cfg: DictConfig, error: BaseException, owner: bool, signum: int | None,
                 same_dir: str) -> tuple[str, int]:
    """Record the stop (``status: interrupted`` with the step and the curve so far) and return the
    ``[lra] INTERRUPTED`` line and the exit code."""
    signum = signum or signal.SIGTERM  # Lightning's own SIGTERMException, raised where no handler of ours ran
    cause = STOPPING_SIGNALS[signum]
    if isinstance(error, StoppedAtOnce):
        cause = "a second SIGINT (Ctrl-C), at once, saving nothing more"
    step, pretrain_step = getattr(error, "step", None), getattr(error, "pretrain_step", None)
    path = run_dir / "results.json"
    if may_write(run_dir, owner) and (read_results(run_dir) or {}).get("status") != "completed":
        path = write_results(run_dir, cfg, "interrupted", steps=step, error=cause,
                             val_curve=getattr(error, "val_curve", None), pretrain_step=pretrain_step)
    stage_dir, where = (run_dir / "pretrain", f"pretraining step {pretrain_step}") if pretrain_step is not None \
        else (run_dir, f"step {step}")
    newest = checkpoints(stage_dir)
    resume = f"resume from {newest[0]}" if newest else "start it again (no checkpoint was saved yet)"
    return (f"[lra] INTERRUPTED by {cause} at {where}: {path}; re-run the same command with {same_dir} to {resume}",
            exit_code(signum))
