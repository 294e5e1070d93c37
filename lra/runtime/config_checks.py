"""The composed run config checked before anything is built: errors Lightning would give late, cryptically or
never (a silent bad run), given early with the key to fix (:func:`validate`), and a note where a setting makes an
approximation exact (:func:`note_exact_landmarks`) or a warmup is cut to fit the run (:func:`note_short_warmup`).
The ``pretrain`` keys: :func:`lra.pretrain.validate`."""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig, OmegaConf

from lra.config_keys import PROBABILITY_NODES, check_probabilities


def is_int(value) -> bool:
    """Whether a config value is an integer (``True`` is an ``int`` to Python, not to a config; used by
    :func:`validate` and :func:`lra.pretrain.validate`)."""
    return isinstance(value, int) and not isinstance(value, bool)


def validate(cfg: DictConfig) -> None:
    """Errors Lightning would give late, cryptically or never (a silent bad run), given early with the key to fix."""
    if not is_int(cfg.seed):
        raise ValueError(f"seed must be an integer (got {cfg.seed!r}); e.g. seed=0, or -m seed=0,1,2 for a sweep")
    if not is_int(cfg.trainer.max_steps) or cfg.trainer.max_steps < 1:
        raise ValueError(f"trainer.max_steps must be an integer >= 1 (got {cfg.trainer.max_steps!r}); "
                         "e.g. trainer.max_steps=100")
    if not is_int(cfg.task.eval_every) or cfg.task.eval_every < 1:
        raise ValueError(f"task.eval_every must be an integer >= 1 (got {cfg.task.eval_every!r}); e.g. task.eval_every=50")
    if not is_int(cfg.task.max_length) or cfg.task.max_length < 1:
        raise ValueError(f"task.max_length must be an integer >= 1 (got {cfg.task.max_length!r}): sequences are "
                         f"truncated to it; e.g. task.max_length=2000 (ListOps in LRA)")
    if not is_int(cfg.task.batch_size) or cfg.task.batch_size < 1:
        raise ValueError(f"task.batch_size must be an integer >= 1 (got {cfg.task.batch_size!r}); e.g. task.batch_size=32")
    accelerator = OmegaConf.select(cfg, "trainer.accelerator")
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError(f"trainer.accelerator={accelerator} (trainer=gpu / ddp) needs a CUDA GPU and torch sees none "
                         f"(torch {torch.__version__}, CUDA {torch.version.cuda or 'not built in'}): train on the CPU "
                         f"with trainer=cpu (the default), or run this on a machine with a GPU")
    workers = OmegaConf.select(cfg, "task.datamodule.num_workers")
    if workers is not None and (not is_int(workers) or workers < 0):
        raise ValueError(f"task.datamodule.num_workers must be an integer >= 0 (got {workers!r}): the data loader "
                         f"processes, 0 loads in the training process; e.g. task.datamodule.num_workers=2")
    lr = OmegaConf.select(cfg, "optimizer.lr")
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0):
        raise ValueError(f"optimizer.lr must be a finite number > 0 (got {lr!r}); e.g. optimizer.lr=1e-4 (the LRA setting)")
    check_probabilities({group: OmegaConf.to_container(cfg[group], resolve=True)
                         for group in PROBABILITY_NODES if cfg.get(group) is not None})


def note_exact_landmarks(cfg: DictConfig) -> None:
    """Say so when a landmark method's ``m`` covers every position: m = min(num_landmarks, n) = n makes it exact."""
    landmarks = OmegaConf.select(cfg, "attention.num_landmarks")
    if is_int(landmarks) and landmarks >= cfg.task.max_length:
        print(f"[lra] note: attention.num_landmarks={landmarks} >= task.max_length={cfg.task.max_length}: every token "
              f"is a landmark, so {cfg.attention.name} computes exact attention here; for the approximation pick "
              f"attention.num_landmarks < {cfg.task.max_length} (e.g. 64)", flush=True)


def note_short_warmup(cfg: DictConfig) -> None:
    """Say so when the learning-rate warmup is as long as the run or longer: the schedule cuts it to fit
    (:mod:`lra.schedules`: one_cycle keeps a decay phase), so the run never reaches the warmup it was given."""
    warmup, steps = OmegaConf.select(cfg, "scheduler.warmup_steps"), cfg.trainer.max_steps
    if is_int(warmup) and is_int(steps) and warmup >= steps:
        print(f"[lra] note: task.warmup_steps={warmup} >= trainer.max_steps={steps}: the warmup is cut to fit the run "
              f"(the learning rate peaks near its end); for the configured schedule give task.warmup_steps < "
              f"trainer.max_steps", flush=True)
