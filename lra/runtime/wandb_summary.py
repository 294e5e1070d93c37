"""A run's record on W&B: flat config keys to group runs by, and every scalar of ``results.json`` in the run summary.

The run config (:func:`run_config`) holds :data:`GROUP_KEYS` at the top (``attention``, ``task``, ``seed``,
``num_landmarks``, ``selection``, ``positions``: what the W&B runs table and panels group and filter by),
the job's ``overrides`` and the whole resolved Hydra config under ``config`` (``config.model.d_model``).

The summary (:func:`write_summary`, called by :func:`lra.runtime.results.write_results` for completed, failed and
interrupted runs alike) gets every top-level scalar of the record under a stable name
(:func:`summary_name`): ``test_acc`` -> ``test/acc``, ``independent_test_acc`` -> ``independent_test/acc``,
``val_acc_best`` -> ``val/acc_best`` (the names the logger uses during training), ``samples_per_s`` ->
``perf/samples_per_s``, ``peak_mem_bytes`` -> ``perf/peak_mem_bytes`` (with ``perf/peak_mem_measure`` saying
which memory it is); the rest keep their names (``steps``, ``train_time_s``, ``status``, ``git_commit``,
``error``, ...). Values the record leaves null are not written, so a failed run keeps what it logged.
``lra.analysis.dashboard`` builds its panels on these names.
"""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

GROUP_KEYS = ("attention", "task", "seed", "num_landmarks", "selection", "positions")
RENAMED = {"val_acc_best": "val/acc_best", "samples_per_s": "perf/samples_per_s",
           "peak_mem_bytes": "perf/peak_mem_bytes", "peak_mem_measure": "perf/peak_mem_measure"}
SCALARS = (str, int, float, bool)


def positions(cfg: DictConfig) -> str | None:
    """How the model is given token order: ``model.positions``' class without ``Positions`` (``learned``,
    ``sinusoidal``, ``rotary``, ``none``: ``models.positions``), None for a model without that setting."""
    target = OmegaConf.select(cfg, "model.positions._target_", default=None)
    if target is None:
        return None
    name = str(target).rsplit(".", 1)[-1].removesuffix("Positions").lower()
    return "none" if name == "no" else name


def group_keys(cfg: DictConfig) -> dict[str, Any]:
    """The flat keys of :data:`GROUP_KEYS` (``None`` where the attention has no such setting)."""
    return {
        "attention": cfg.attention.name,
        "task": cfg.task.name,
        "seed": cfg.seed,
        "num_landmarks": OmegaConf.select(cfg, "attention.num_landmarks", default=None),
        "selection": OmegaConf.select(cfg, "attention.selection", default=None),
        "positions": positions(cfg),
    }


def run_config(cfg: DictConfig, overrides: list[str]) -> dict[str, Any]:
    """What the loggers record as the run's hyperparameters: flat keys, overrides, the resolved config."""
    return {**group_keys(cfg), "overrides": overrides, "config": OmegaConf.to_container(cfg, resolve=True)}


def summary_name(field: str) -> str:
    """The summary key of a ``results.json`` field: ``<split>_acc`` -> ``<split>/acc``, :data:`RENAMED`, else itself."""
    if field in RENAMED:
        return RENAMED[field]
    return f"{field.removesuffix('_acc')}/acc" if field.endswith("_acc") else field


def summary_fields(record: dict[str, Any]) -> dict[str, Any]:
    """Every non-null top-level scalar of a ``results.json`` record, under its summary name."""
    return {summary_name(key): value for key, value in record.items() if isinstance(value, SCALARS)}


def active_run():
    """This process's W&B run, or None; wandb is never imported here (not imported: no logger made a run, and a
    ``logger=csv`` run needs no wandb installed)."""
    return getattr(sys.modules.get("wandb"), "run", None)


def write_summary(record: dict[str, Any]) -> None:
    """Put the record into the active W&B run's summary; nothing when this process has no W&B run."""
    run = active_run()
    if run is not None:
        run.summary.update(summary_fields(record))


def finish_wandb() -> None:
    """Close the W&B run of this job so the next job of a multirun opens its own (nothing to close where no logger
    made one)."""
    run = active_run()
    if run is not None:
        run.finish()
