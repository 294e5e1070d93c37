"""Train one model on one LRA task: ``python -m lra.train [task=...] [attention=...] [seed=...]``.

Composes ``configs/train.yaml``, builds the datamodule, model, callbacks, loggers and trainer from
their ``_target_`` configs, fits (resuming from ``<run dir>/checkpoints/last.ckpt`` when present),
tests the best-validation checkpoint and writes ``<run dir>/results.json``. In a multirun a failing
job records ``status: failed`` and the sweep goes on; the sweep exits non-zero at the end.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from lra.checkpoints import load_transferred_weights
from lra.module import build_module
from lra.results import job_overrides, write_results



def validate(cfg: DictConfig) -> None:
    """Errors Lightning would give late or cryptically, given early with the config key to fix."""
    if cfg.trainer.max_steps is None or cfg.trainer.max_steps < 1:
        raise ValueError(f"trainer.max_steps must be >= 1 (got {cfg.trainer.max_steps}); e.g. trainer.max_steps=100")
    if cfg.task.eval_every < 1:
        raise ValueError(f"task.eval_every must be >= 1 (got {cfg.task.eval_every})")


def build_trainer(cfg: DictConfig, run_dir: Path) -> L.Trainer:
    callbacks = [instantiate(node) for node in (cfg.callbacks or {}).values()]
    loggers = [instantiate(node) for node in (cfg.logger or {}).values()]
    return instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, default_root_dir=str(run_dir))


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Fit and test; return the metrics recorded in ``results.json``."""
    validate(cfg)
    L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.task.datamodule)
    module = build_module(cfg)
    if cfg.get("init_from"):
        load_transferred_weights(module.model, cfg.init_from)
    if cfg.get("finetune"):
        module.model = instantiate(cfg.finetune)(module.model)
    trainer = build_trainer(cfg, run_dir)
    for logger in trainer.loggers:
        logger.log_hyperparams({**OmegaConf.to_container(cfg, resolve=True), "overrides": job_overrides()})
    last = run_dir / "checkpoints" / "last.ckpt"
    resumed_from_step = None
    if last.exists():
        resumed_from_step = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
        print(f"[lra] resuming from {last} (step {resumed_from_step})", flush=True)
    started = time.perf_counter()
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(last) if last.exists() else None)
    train_time = time.perf_counter() - started
    has_best = bool(getattr(trainer.checkpoint_callback, "best_model_path", ""))
    test_metrics = trainer.test(module, datamodule=datamodule, ckpt_path="best" if has_best else None)[0]
    return {
        "val_acc_best": float(module.val_acc_best.compute()),
        "test_acc": float(test_metrics["test/acc"]),
        "steps": trainer.global_step,
        "train_time_s": train_time,
        "samples_per_s": module.samples_seen * trainer.world_size / train_time if train_time > 0 else None,
        "best_checkpoint": trainer.checkpoint_callback.best_model_path if has_best else None,
        "resumed_from_step": resumed_from_step,
        "val_curve": module.val_curve,
    }


def finish_wandb() -> None:
    """Close the W&B run of this job so the next job of a multirun opens its own."""
    import wandb

    if wandb.run is not None:
        wandb.finish()


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    if multirun and cfg.get("group") is None:
        with open_dict(cfg):
            cfg.group = Path(hydra_cfg.sweep.dir).name
    print(f"[lra] run dir: {run_dir}", flush=True)
    try:
        metrics = train(cfg, run_dir)
    except Exception as error:
        path = write_results(run_dir, cfg, "failed", error=f"{type(error).__name__}: {error}",
                             traceback=traceback.format_exc())
        print(f"[lra] FAILED: {type(error).__name__}: {error} (details in {path})", flush=True)
        if not multirun:
            raise
        return None
    finally:
        finish_wandb()
    path = write_results(run_dir, cfg, "completed", **metrics)
    print(f"[lra] test acc {metrics['test_acc']:.4f} (best val {metrics['val_acc_best']:.4f}); results: {path}", flush=True)
    return metrics["test_acc"]


if __name__ == "__main__":
    main()
