"""What a run prints: quiet by default, everything with ``verbose=true`` (docs/usage.md "Console output").

:class:`QuietConsole` (a Hydra callback, configs/hydra/default.yaml) runs in each job's process, before the job:
unless ``verbose`` is true it raises Lightning's loggers to WARNING (their INFO messages: "GPU available",
"Seed set to 0", the litlogger tip, "`Trainer.fit` stopped", "Restoring states from ...") and ignores the
warnings of :data:`HARMLESS_WARNINGS`; after the job it puts both back (the next job of a sweep may be verbose).
The other quiet defaults are configs: ``trainer.enable_model_summary: ${verbose}``, the W&B logger's
``verbose: ${verbose}`` (:class:`lra.runtime.wandb_logger.WandbLogger`), and Lightning's test table (``trainer.test``
is called with ``verbose=cfg.verbose``). Any other warning is printed as usual.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import ExitStack
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

# Loggers whose INFO messages are chatter; each has its own level (set by Lightning at import), so all three.
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
# (category, message regex, why it is harmless): warnings about the libraries, not about the run.
HARMLESS_WARNINGS = (
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated",
     "torch >= 2.10 deprecates the LeafSpec class that Lightning 2.6's _pytree still builds: nothing to change here"),
    (UserWarning, r"You passed in a `val_dataloader` but have no `validation_step`",
     "the self-pretraining stage (lra.pretrain) has no validation by design; the datamodule serves both stages"),
    (UserWarning, r"The number of training batches \(\d+\) is smaller than the logging interval",
     "a run is defined in steps across epochs, and Lightning counts log_every_n_steps over all of them: a short "
     "epoch loses no logged step"),
)


class QuietConsole(Callback):
    """Lightning's INFO messages and :data:`HARMLESS_WARNINGS` off for a job whose ``verbose`` is false."""

    def __init__(self) -> None:
        self.restore = ExitStack()  # what on_job_end puts back

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if "verbose" not in config:
            raise SystemExit("[lra] the config has no `verbose` key, which lra.runtime.console.QuietConsole (registered in "
                             "configs/hydra/default.yaml) reads: add `verbose: false` to the primary config")
        if config.verbose:
            return
        for name in LIGHTNING_LOGGERS:
            logger = logging.getLogger(name)
            self.restore.callback(logger.setLevel, logger.level)
            logger.setLevel(logging.WARNING)
        self.restore.enter_context(warnings.catch_warnings())
        for category, message, _ in HARMLESS_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.restore.close()
