"""Stopping a run by a signal: SIGTERM (preemption, ``kill``) and SIGINT (Ctrl-C) take one path.

The first SIGTERM or SIGINT stops the run gracefully. Inside Lightning's fit or test it sets Lightning's stop
flag (the one its own SIGTERM handler sets): the training batch in flight is finished, then Lightning raises
``SIGTERMException`` and :class:`lra.runtime.callbacks.LastCheckpoint` saves ``interrupted-<step>.ckpt`` and
``last.ckpt`` of that step, a state as consistent as any periodic checkpoint, so a resume from it equals a run
never stopped. (A SIGINT left to Python would raise ``KeyboardInterrupt`` in the middle of the step, and the
checkpoint Lightning then saves counts the step in flight on one side and not on the other.) A stop that lands in
a validation of fit, or in the training batch before one, waits for that validation to end
(:class:`FinishValidation`). Outside fit and test (data set-up, between sweep jobs) nothing is in flight and it
stops at once. ``lra.train`` then records ``status: interrupted`` and prints how to resume.

A second SIGINT (Ctrl-C pressed again while the run stops) stops at once with :class:`StoppedAtOnce`, and
nothing more is saved: checkpoints are written atomically, so the newest one is whole and the re-run resumes
from it, as after a SIGKILL. A second SIGTERM changes nothing (DDP ranks relay SIGTERM to each other).
"""

from __future__ import annotations

import os
import signal

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

STOPPING_SIGNALS = {signal.SIGTERM: "SIGTERM (preempted or stopped)", signal.SIGINT: "SIGINT (Ctrl-C)"}


def exit_code(signum: int) -> int:
    """What a shell reports for a process ended by ``signum`` (143 for SIGTERM, 130 for SIGINT)."""
    return 128 + signum


SIGTERM_EXIT_CODE = exit_code(signal.SIGTERM)


class StoppedAtOnce(SIGTERMException):
    """A second Ctrl-C: the run stopped where it was, saving nothing more."""


class StopSignals:
    """The SIGTERM and SIGINT handler of a run (:meth:`install`). ``received``: the first of them, or None;
    ``validating``: the trainer whose fit is validating (a stop waits for the end: :class:`FinishValidation`);
    ``held``: a stop waiting for it."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.received: int | None = None
        self.forwarding = False
        self.validating: L.Trainer | None = None
        self.held = False

    def install(self) -> None:
        self.reset()
        for signum in STOPPING_SIGNALS:
            signal.signal(signum, self.handle)

    def handle(self, signum: int, frame) -> None:
        if self.forwarding:  # our own SIGINT, passed on to Lightning's SIGTERM handler, which calls this one too
            return
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise StoppedAtOnce(exit_code(signal.SIGINT))
        first = self.received is None
        self.received = self.received or signum
        lightning = signal.getsignal(signal.SIGTERM)
        if not callable(lightning) or lightning == self.handle:  # outside fit/test: nothing in flight
            raise SIGTERMException(exit_code(self.received))
        if signum == signal.SIGINT and first:  # os.write: a print here could re-enter a print the signal interrupted
            os.write(2, b"\n[lra] Ctrl-C: stopping as on SIGTERM, after the step in flight (and its validation), "
                        b"which is saved; Ctrl-C again stops at once (the newest checkpoint already saved is kept)\n")
        if self.validating is not None:
            self.held = True
            self.hold(self.validating)  # Lightning's SIGTERM handler set its flag before calling this one
        elif signum == signal.SIGINT:
            self.forwarding = True
            try:
                lightning(signal.SIGTERM, frame)  # Lightning stops at the end of the batch
            finally:
                self.forwarding = False

    def hold(self, trainer: L.Trainer) -> None:
        """Take back Lightning's stop flag until the validation ends (Lightning has no public setter for it)."""
        self.held = self.held or trainer.received_sigterm
        trainer._signal_connector.received_sigterm = False

    def release(self, trainer: L.Trainer) -> None:
        """Hand a held stop to Lightning: it stops at the end of the step, after this validation."""
        self.validating = None
        if self.held:
            trainer._signal_connector.received_sigterm = True
        self.held = False


STOP_SIGNALS = StopSignals()


class FinishValidation(L.Callback):
    """A stop requested during a validation of fit, or in the training batch before one, takes effect when the
    validation has ended.

    Inside a validation Lightning stops after the validation batch in flight, and a resume from that checkpoint
    skips the rest of the validation (Lightning resumes a validation only from a batch cut short): that step's
    point of the curve, its ``metrics.csv`` row and its best checkpoint would be lost. Held back to the end of the
    step, the stop saves the state a run never stopped has after the same step."""

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            STOP_SIGNALS.validating = trainer
            STOP_SIGNALS.hold(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if STOP_SIGNALS.validating is trainer:
            STOP_SIGNALS.release(trainer)
