"""The loggers and the Lightning trainer of a run, from their ``_target_`` configs, with what every run adds.

Every trainer (training, self-pretraining and ``lra.evaluate`` alike) gets, beside the configured callbacks:
:class:`lra.runtime.csv_logger.CSVRowsInCheckpoint` for each ``metrics.csv`` logger (a resumed run continues the
file from the rows its checkpoint records), :class:`lra.runtime.interrupts.FinishValidation` (a SIGTERM / Ctrl-C
during a validation stops after it) and, unless a configured plugin saves checkpoints itself,
:class:`lra.runtime.checkpoints.AtomicCheckpointIO` (a checkpoint is never left cut short under its final name).
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig

from lra.runtime.checkpoints import AtomicCheckpointIO
from lra.runtime.csv_logger import CSVRowsInCheckpoint, RunCSVLogger
from lra.runtime.interrupts import FinishValidation
from lra.runtime.results import job_overrides
from lra.runtime.wandb_summary import run_config


def build_loggers(cfg: DictConfig) -> list:
    """The configured loggers, with the run's hyperparameters logged once (both stages share them: one W&B run)."""
    loggers = [instantiate(node) for node in (cfg.logger or {}).values()]
    for logger in loggers:
        logger.log_hyperparams(run_config(cfg, job_overrides()))
    return loggers


def build_trainer(cfg: DictConfig, run_dir: Path, loggers: list | None = None, callbacks: list | None = None,
                  **overrides) -> L.Trainer:
    """The configured trainer (``overrides`` replace ``cfg.trainer`` keys); the configured loggers and callbacks
    where none are given."""
    if loggers is None:
        loggers = [instantiate(node) for node in (cfg.logger or {}).values()]
    if callbacks is None:
        callbacks = [instantiate(node) for node in (cfg.callbacks or {}).values()]
    # a resumed run continues its metrics.csv from the rows its checkpoint records
    callbacks = [*callbacks, *(CSVRowsInCheckpoint(logger) for logger in loggers if isinstance(logger, RunCSVLogger))]
    callbacks.append(FinishValidation())  # a SIGTERM / Ctrl-C during a validation stops after it (lra.runtime.interrupts)
    plugins = [instantiate(node) for node in (cfg.trainer.get("plugins") or [])]
    if not any(hasattr(plugin, "save_checkpoint") for plugin in plugins):
        plugins.append(AtomicCheckpointIO())  # checkpoints are never left cut short under their final name
    return instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, default_root_dir=str(run_dir),
                       plugins=plugins, **overrides)


def best_checkpoint(trainer: L.Trainer) -> str | None:
    """The path of the best-validation checkpoint so far, or None (no checkpoint callback, or none saved yet)."""
    return getattr(trainer.checkpoint_callback, "best_model_path", "") or None
