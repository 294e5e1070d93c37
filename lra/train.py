"""Train one model on one LRA task: ``python -m lra.train [task=...] [attention=...] [seed=...]``.

Composes ``configs/train.yaml``, builds the datamodule, model, callbacks, loggers and trainer from
their ``_target_`` configs, fits (resuming from the newest checkpoint of ``<run dir>/checkpoints`` that
loads; a command whose settings are not the run dir's recorded ones is refused first: :mod:`lra.runtime.run_dir`),
tests the best-validation checkpoint and writes ``<run dir>/results.json`` (with ``train_examples`` and the task's
shortcut on each evaluated split, ``shortcut_<split>_acc``: :meth:`lra.tasks.base.CachedDataModule.shortcut_record`). With ``pretrain.steps > 0`` a
self-pretraining stage runs first in ``<run dir>/pretrain/`` (:func:`pretrain_stage`). A run dir that already
holds a completed run is not trained again; a run dir another process is using is refused before anything is
written there (:mod:`lra.runtime.run_lock`). In a multirun a failing job records ``status: failed`` and the sweep goes on;
the sweep exits non-zero at the end. A failure prints ``[lra] FAILED: <error>`` last, its traceback going to
``<run dir>/error.log`` (:mod:`lra.runtime.run_end`). SIGTERM (preemption) and SIGINT (Ctrl-C) record
``status: interrupted`` with the step, stop the run (and a sweep) and exit 143 / 130; re-running resumes exactly
(:mod:`lra.runtime.interrupts`).
"""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from lightning.pytorch.utilities.exceptions import SIGTERMException

from lra.runtime.allocator import retain_freed_memory
from lra.runtime.checkpoints import AtomicCheckpointIO, load_transferred_weights
from lra.config import CONFIG_DIR
from lra.runtime.config_groups import check_command_line
from lra.config_keys import PROBABILITY_NODES, check_probabilities
from lra.runtime.csv_logger import CSVRowsInCheckpoint, RunCSVLogger
from lra.runtime.gpu_setup import setup_gpu_run
from lra.runtime.hydra_callbacks import unfinished_jobs
from lra.runtime.interrupts import STOP_SIGNALS, FinishValidation
from lra.module import build_datamodule, build_module
from lra.pretrain import ENCODER_CHECKPOINT, build_pretrain_module, pretrain_callbacks, read_encoder_record
from lra.pretrain import validate as validate_pretrain
from lra.runtime.run_dir import ResumeRefused, check_resume, claim, drop_unused_pretrain, resume_checkpoint, settings_differences
from lra.runtime.run_end import failure, interruption
from lra.runtime.run_lock import RunDirInUse, hold, release
from lra.runtime.results import (git_commit, job_overrides, read_results, reset_peak_memory, write_predictions,
                         write_results)
from lra.runtime.wandb_summary import active_run, run_config


def is_int(value) -> bool:
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


def pretrain_stage(cfg: DictConfig, run_dir: Path, loggers: list) -> tuple[Path, dict]:
    """Self-pretraining (:mod:`lra.pretrain`) in ``<run dir>/pretrain/``: ``pretrain.steps`` steps on the train
    split, no validation, ``last.ckpt`` every ``pretrain.checkpoint_every`` steps in ``pretrain/checkpoints/``
    (resumed from when interrupted), then ``pretrain/encoder.ckpt`` (weights, loss curve, wall time), which marks
    the stage done: a re-run reads it and goes on to the supervised stage. Returns its path and the record."""
    stage_dir = run_dir / "pretrain"
    encoder = stage_dir / ENCODER_CHECKPOINT
    if not encoder.is_file():
        L.seed_everything(cfg.seed, workers=True)
        datamodule = build_datamodule(cfg)
        module = build_pretrain_module(cfg)
        trainer = build_trainer(cfg, stage_dir, loggers, pretrain_callbacks(cfg, stage_dir), max_steps=cfg.pretrain.steps,
                                limit_val_batches=0, num_sanity_val_steps=0, enable_model_summary=False)
        resume_from, _ = resume_checkpoint(stage_dir)
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
        except BaseException as error:
            error.step, error.pretrain_step = 0, trainer.global_step  # no supervised step yet
            raise
        trainer.save_checkpoint(encoder, weights_only=True)  # with the stage's wall time (its clock)
    print(f"[lra] pretraining done: {encoder}; the supervised stage starts from its encoder", flush=True)
    return encoder, read_encoder_record(encoder)


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Fit and test; return the metrics recorded in ``results.json``."""
    validate(cfg)
    validate_pretrain(cfg)
    note_exact_landmarks(cfg)
    retain_freed_memory()
    setup_gpu_run(cfg)  # TF32 float32 products on a GPU (lra/runtime/gpu_setup.py)
    loggers = build_loggers(cfg)
    init_from, pretrained = cfg.get("init_from"), {}
    if cfg.pretrain.steps:
        init_from, pretrained = pretrain_stage(cfg, run_dir, loggers)
    L.seed_everything(cfg.seed, workers=True)
    datamodule = build_datamodule(cfg)
    module = build_module(cfg)
    if init_from:
        load_transferred_weights(module.model, init_from)
    if cfg.get("finetune"):
        module.model = instantiate(cfg.finetune)(module.model)
    trainer = build_trainer(cfg, run_dir, loggers)
    resume_from, resumed_from_step = resume_checkpoint(run_dir)
    reset_peak_memory()
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
        train_time, samples = module.clock.seconds(), module.samples_seen  # before testing loads a checkpoint
        has_best = bool(getattr(trainer.checkpoint_callback, "best_model_path", ""))
        val_curve = list(module.val_curve)  # testing loads the best checkpoint, whose curve ends at its step
        per_loader = trainer.test(module, datamodule=datamodule, verbose=cfg.verbose,
                                  ckpt_path=trainer.checkpoint_callback.best_model_path if has_best else None)
    except BaseException as error:
        error.step = trainer.global_step  # the step the failed / interrupted record names, and its curve so far
        error.val_curve = list(module.val_curve)
        raise
    write_test_predictions(trainer, module, run_dir)
    return {
        "val_acc_best": float(module.val_acc_best.compute()),
        **test_accuracies(per_loader),
        "steps": trainer.global_step,
        "train_time_s": train_time,
        "samples_per_s": samples * trainer.world_size / train_time if train_time > 0 else None,
        "best_checkpoint": trainer.checkpoint_callback.best_model_path if has_best else None,
        "resumed_from_step": resumed_from_step,
        "val_curve": val_curve,
        "train_examples": len(datamodule.splits["train"]),
        **datamodule.shortcut_record(),
        **pretrained,
    }


def test_accuracies(per_loader: list[dict]) -> dict[str, float]:
    """``trainer.test``'s metrics (one dict per test loader) as ``{"<split>_acc": value}``: ``test_acc``, and
    ``independent_test_acc`` where the data holds that split."""
    metrics = {key: value for loader_metrics in per_loader for key, value in loader_metrics.items()}
    return {f"{key.removesuffix('/acc')}_acc": float(value) for key, value in metrics.items() if key.endswith("/acc")}


def write_test_predictions(trainer: L.Trainer, module, run_dir: Path) -> None:
    """``predictions.json`` beside ``results.json`` (one process only: under DDP each rank saw a share)."""
    if trainer.world_size == 1:
        write_predictions(run_dir, module.test_predictions)
    else:
        print(f"[lra] predictions.json not written: {trainer.world_size} processes each tested a share of the "
              "examples; test on one device (lra.evaluate) for per-example predictions", flush=True)


def finish_wandb() -> None:
    """Close the W&B run of this job so the next job of a multirun opens its own (nothing to close where no logger
    made one)."""
    run = active_run()
    if run is not None:
        run.finish()


def already_completed(run_dir: Path, cfg: DictConfig, multirun: bool) -> dict | None:
    """The completed record in ``run_dir`` (then this run is not trained again), or None.

    Same settings: the record is returned as it is. Other settings: an error (a single run) or a
    message (a sweep job), and the record is left unchanged either way.
    """
    record = read_results(run_dir)
    if record is None or record.get("status") != "completed":
        return None
    recorded, current = drop_unused_pretrain(record.get("config") or {}, OmegaConf.to_container(cfg, resolve=False))
    differences = [f"{key}: {old} -> {new}" for key, old, new in settings_differences(recorded, current)]  # as a resume
    if differences:
        message = (f"{run_dir} already holds a completed run with other settings ({'; '.join(differences)}): not "
                   f"re-run, its results.json is kept. To train these settings from that run's weights (the optimiser "
                   f"and schedule start afresh), run them in a new run dir: {continue_command(run_dir, cfg, record)}; "
                   f"from scratch: the same without init_from")
        if not multirun:
            raise SystemExit(f"[lra] NOT RE-RUN: {message}")
        print(f"[lra] NOT RE-RUN: {message}", flush=True)
    else:
        print(f"[lra] already completed: test acc {record.get('test_acc')} at step {record.get('steps')}; results kept "
              f"in {run_dir / 'results.json'} (to train again, run the command without "
              f"{'hydra.sweep.dir' if multirun else 'hydra.run.dir'}: a new run dir)", flush=True)
    return record


def continue_command(run_dir: Path, cfg: DictConfig, record: dict) -> str:
    """The command that trains this job's settings in a new run dir (no ``hydra.run.dir``) from the weights of the
    completed run in ``run_dir`` (``init_from``: its ``last.ckpt``, else its best checkpoint)."""
    last = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = last if last.is_file() else record.get("best_checkpoint")
    overrides = [o for o in job_overrides() if not o.lstrip("+").startswith(("init_from=", "pretrain.steps="))]
    pretrained = ["pretrain.steps=0"] if cfg.pretrain.steps else []  # init_from and pretraining exclude each other
    return shlex.join(["python", "-m", "lra.train", *overrides, *pretrained, f"init_from={checkpoint}"])


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def hydra_main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    dir_key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    same_dir = f"{dir_key}={hydra_cfg.sweep.dir if multirun else run_dir}"
    if multirun and cfg.get("group") is None:
        with open_dict(cfg):
            cfg.group = Path(hydra_cfg.sweep.dir).name
    STOP_SIGNALS.install()
    owner = took_lock = False  # owner: whether this run may write its record here (once the dir's settings match)
    interrupted = failed = None  # the line to print last, after the loggers have closed
    try:  # from here on a SIGTERM or SIGINT is recorded as an interruption, wherever it lands
        print(f"[lra] run dir: {run_dir} (code: {git_commit()})", flush=True)
        took_lock = hold(run_dir, dir_key)  # a sweep job locks its dir here; a single run holds it (RunDirOwner)
        if (record := already_completed(run_dir, cfg, multirun)) is not None:
            return record.get("test_acc")
        check_resume(run_dir, cfg)  # reads only: a refused run writes nothing
        claim(run_dir, cfg)
        owner = True
        if (read_results(run_dir) or {}).get("status") == "not_started":  # written when the sweep started; a job
            (run_dir / "results.json").unlink()  # killed from now on shows as "missing" (no results.json), as before
        metrics = train(cfg, run_dir)
    except (ResumeRefused, RunDirInUse) as refusal:  # nothing was written
        if not multirun:
            raise
        print(refusal.code, flush=True)
        return None
    except SIGTERMException as error:
        interrupted = interruption(run_dir, cfg, error, owner, STOP_SIGNALS.received, same_dir)
    except Exception as error:
        failed = failure(run_dir, cfg, error, owner, cfg.get("verbose") or hydra_cfg.verbose)
    else:  # before `finally`: the record also goes into the W&B run's summary, which finish_wandb closes
        path = write_results(run_dir, cfg, "completed", **metrics)
    finally:
        finish_wandb()
        if took_lock:
            release(run_dir)
    if interrupted is not None:
        message, code = interrupted
        print(message, flush=True)
        if multirun:
            sweep_dir = Path(hydra_cfg.sweep.dir)
            print(f"[lra] sweep {sweep_dir} stopped; unfinished jobs:\n  " + "\n  ".join(unfinished_jobs(sweep_dir)),
                  file=sys.stderr, flush=True)
        raise SystemExit(code)
    if failed is not None:
        print(failed, file=sys.stderr, flush=True)
        if not multirun:
            raise SystemExit(1)
        return None
    independent = (f", independent test acc {metrics['independent_test_acc']:.4f}"
                   if "independent_test_acc" in metrics else "")
    print(f"[lra] test acc {metrics['test_acc']:.4f}{independent} (best val {metrics['val_acc_best']:.4f}); "
          f"results: {path}", flush=True)
    return metrics["test_acc"]


def main() -> None:
    """``python -m lra.train`` and ``lra-train``: the command line's config-group choices checked first (an unknown
    one is refused before anything is written: :mod:`lra.runtime.config_groups`), then Hydra runs :func:`hydra_main`."""
    check_command_line()
    hydra_main()


if __name__ == "__main__":
    main()
