"""``results.json``: the one record of a run that reports, sweeps and users read."""

from __future__ import annotations

import functools
import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from lra import REPO_ROOT
from lra.tasks.files import atomic_write_text
from lra.runtime.wandb_summary import write_summary


@functools.cache
def git_commit() -> str | None:
    """Commit of the checkout (``+dirty`` when it has uncommitted changes), or None outside git.

    Read once per process (``lra.train`` reads it when a job starts): a record written hours later names
    the code the run imported, not a commit made while it trained."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty else "")


def peak_memory() -> tuple[int, str]:
    """``(bytes, what they measure)``: CUDA ``max_memory_allocated`` since :func:`reset_peak_memory` when training ran
    on a GPU (``cuda_max_allocated``), else the peak RSS of this process since it started (``process_peak_rss``:
    in a sweep whose jobs share a process, the largest job's so far)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated()), "cuda_max_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024), "process_peak_rss"


def reset_peak_memory() -> None:
    """Start a run's CUDA peak anew (the jobs of a sweep may share a process); peak RSS cannot be reset."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def job_overrides() -> list[str]:
    """The Hydra job's command-line/sweep overrides (``a.b=v``), or [] outside Hydra; the report groups on them."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def read_results(run_dir: Path) -> dict | None:
    """``run_dir/results.json`` as a dict, or None when there is none (or it is unreadable)."""
    try:
        return json.loads((Path(run_dir) / "results.json").read_text())
    except (OSError, ValueError):
        return None


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists are values)."""
    if not isinstance(node, dict) or not node:
        return {prefix: node}
    return {k: v for key, value in node.items() for k, v in flatten(value, f"{prefix}.{key}" if prefix else str(key)).items()}


# Keys added to the configs after runs were recorded, with the value those runs ran with: a record without the
# key compares as that value, so a run recorded before the key existed still resumes and still counts as done.
# (attention.lra_code: Performer's reference-code form, 202664c; every attention without it computes as if false.)
ADDED_LATER = {"model.compile": False, "task.group_by_length": False, "task.augment": None, "verbose": False,
               "accept_changed_data": False, "attention.lra_code": False}
# Keys added later that only follow others (the datamodule's copies of the keys above, the choices of task.augment,
# the folder listops_small generates into without a note): a record without one is compared without it.
ADDED_LATER_DERIVED = ("task.datamodule.group_by_length", "task.datamodule.augment", "task.augmentations",
                       "task.datamodule.augmentations", "task.datamodule.generate.default_dir")
# Values renamed later to ones that compute the same: (key, old value) -> new value. The best-checkpoint callback
# became lra.runtime.callbacks.RelocatableCheckpoint (Lightning's, with its paths read relative to a moved run dir).
RENAMED_LATER = {("callbacks.checkpoint._target_", "lightning.pytorch.callbacks.ModelCheckpoint"):
                 "lra.runtime.callbacks.RelocatableCheckpoint"}
# Modules moved later, old prefix -> new: the run lifecycle moved from lra/ into lra/runtime/ (2026-11-28), so a
# recorded ``_target_: lra.callbacks.LastCheckpoint`` compares as ``lra.runtime.callbacks.LastCheckpoint``.
MOVED_LATER = {f"lra.{name}.": f"lra.runtime.{name}." for name in (
    "allocator", "callbacks", "checkpoints", "config_groups", "console", "csv_logger", "gpu_setup", "hydra_callbacks",
    "interrupts", "progress", "results", "run_dir", "run_end", "run_lock", "stage_clock", "sweep_console",
    "wandb_logger", "wandb_summary")}


def renamed(key: str, value: str) -> str:
    """``value`` of ``key`` under today's names (:data:`RENAMED_LATER`, :data:`MOVED_LATER`)."""
    value = RENAMED_LATER.get((key, value), value)
    old = value.rsplit(".", 1)[0] + "."
    return MOVED_LATER[old] + value[len(old):] if old in MOVED_LATER else value


def flat_settings(config: dict) -> dict[str, Any]:
    """``config`` flattened as JSON stores it, with :data:`ADDED_LATER`'s values for the keys it lacks and
    today's names for renamed values and moved modules (:func:`renamed`)."""
    flat = {**ADDED_LATER, **flatten(json.loads(json.dumps(config, default=str)))}
    return {key: renamed(key, value) if isinstance(value, str) else value for key, value in flat.items()}


def compared_settings(recorded: dict, current: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both configs as :func:`flat_settings`, the current one without the :data:`ADDED_LATER_DERIVED` keys the
    recorded one lacks."""
    def under(key: str, prefix: str) -> bool:
        return key == prefix or key.startswith(prefix + ".")

    old, new = flat_settings(recorded), flat_settings(current)
    lacking = [prefix for prefix in ADDED_LATER_DERIVED if not any(under(key, prefix) for key in old)]
    return old, {key: value for key, value in new.items() if not any(under(key, prefix) for prefix in lacking)}


def config_differences(recorded: dict, current: dict, limit: int = 5) -> list[str]:
    """``key: recorded -> current`` for the (first ``limit``) keys whose values differ, as JSON stores them
    (:func:`compared_settings`: keys added later compare as their old value, or not at all)."""
    old, new = compared_settings(recorded, current)
    keys = sorted(key for key in old.keys() | new.keys() if old.get(key, "<absent>") != new.get(key, "<absent>"))
    shown = [f"{key}: {old.get(key, '<absent>')} -> {new.get(key, '<absent>')}" for key in keys[:limit]]
    return shown + ([f"{len(keys) - limit} more"] if len(keys) > limit else [])


def write_predictions(run_dir: Path, predictions: dict[str, dict[str, list[torch.Tensor]]]) -> Path:
    """``run_dir/predictions.json``: ``{split: {"pred": [...], "label": [...]}}`` per test example, in the data's
    order, for paired tests between runs on the same examples (``lra.analysis.report``'s McNemar column)."""
    path = Path(run_dir) / "predictions.json"
    record = {split: {key: torch.cat(values).tolist() if values else [] for key, values in columns.items()}
              for split, columns in predictions.items()}
    atomic_write_text(path, json.dumps(record, separators=(",", ":")))
    return path


def test_accuracies(per_loader: list[dict]) -> dict[str, float]:
    """``trainer.test``'s metrics (one dict per test loader) as ``{"<split>_acc": value}``: ``test_acc``, and
    ``independent_test_acc`` where the data holds that split."""
    metrics = {key: value for loader_metrics in per_loader for key, value in loader_metrics.items()}
    return {f"{key.removesuffix('/acc')}_acc": float(value) for key, value in metrics.items() if key.endswith("/acc")}


def write_test_predictions(trainer, module, run_dir: Path) -> None:
    """``predictions.json`` beside ``results.json`` (one process only: under DDP each rank saw a share)."""
    if trainer.world_size == 1:
        write_predictions(run_dir, module.test_predictions)
    else:
        print(f"[lra] predictions.json not written: {trainer.world_size} processes each tested a share of the "
              "examples; test on one device (lra.evaluate) for per-example predictions", flush=True)


def write_results(run_dir: Path, cfg: DictConfig, status: str, **fields: Any) -> Path:
    """Write ``run_dir/results.json`` with the identifying fields, ``status`` and the given metrics.

    Beside it, ``config_resolved.yaml`` (every interpolation resolved; Hydra's ``.hydra/config.yaml``
    keeps them unresolved); its scalars also go into the W&B run summary, if there is a run
    (:func:`lra.runtime.wandb_summary.write_summary`). Under DDP only global rank 0 writes (every rank returns the same path).
    """
    path = Path(run_dir) / "results.json"
    if rank_zero_only.rank != 0:
        return path
    peak_mem_bytes, peak_mem_measure = peak_memory()
    record = {
        "task": cfg.task.name,
        "attention": cfg.attention.name,
        "seed": cfg.seed,
        "status": status,
        "val_acc_best": None,
        "test_acc": None,
        "steps": None,
        "train_time_s": None,
        "samples_per_s": None,
        "peak_mem_bytes": peak_mem_bytes,
        "peak_mem_measure": peak_mem_measure,
        **fields,
        "git_commit": git_commit(),
        "overrides": job_overrides(),
        "config": OmegaConf.to_container(cfg, resolve=False),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write_text(path.parent / "config_resolved.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    except OSError:
        raise
    except Exception as error:  # an unresolvable value is often why the run failed: keep results.json
        record["config_resolve_error"] = f"{type(error).__name__}: {error}"
    atomic_write_text(path, json.dumps(record, indent=2, default=str))
    write_summary(record)
    return path
