"""Train one model on one LRA task: ``python -m lra.train [task=...] [attention=...] [seed=...]``.

:func:`train` reads top-down as compose -> instantiate -> fit -> test -> record:

- compose: Hydra composes ``configs/train.yaml`` with the command line (an unknown config-group choice is refused
  first: :mod:`lra.runtime.config_groups`); its values are checked before anything is built
  (:mod:`lra.runtime.config_checks`, :func:`lra.pretrain.validate`);
- instantiate: loggers, datamodule, model and trainer from their ``_target_`` configs (:mod:`lra.runtime.trainer`).
  With ``pretrain.steps > 0`` a self-pretraining stage runs first in ``<run dir>/pretrain/``
  (:func:`lra.pretrain.pretrain_stage`) and the model starts from its encoder; else from ``init_from`` when given;
  ``finetune`` wraps it (:mod:`lra.finetune`);
- fit: resuming from the checkpoint of ``<run dir>/checkpoints`` that loads with the highest step
  (:func:`lra.runtime.run_dir.resume_checkpoint`);
- test: the best-validation checkpoint, each test example's prediction in ``predictions.json``;
- record: the metrics :func:`train` returns go into ``<run dir>/results.json`` (with ``train_examples`` and the
  task's shortcut on each evaluated split, ``shortcut_<split>_acc``:
  :meth:`lra.tasks.base.CachedDataModule.shortcut_record`).

Around it, :func:`lra.runtime.job.run_job` runs the job: the run dir locked (another process's dir is refused before
anything is written there: :mod:`lra.runtime.run_lock`), a completed run not trained again, a command whose
settings are not the run dir's recorded ones refused (:mod:`lra.runtime.run_dir`). A failure prints
``[lra] FAILED: <error>`` last, its traceback going to ``<run dir>/error.log`` (:mod:`lra.runtime.run_end`); in a
multirun the failing job records ``status: failed``, the sweep goes on and exits non-zero at the end. SIGTERM
(preemption) and SIGINT (Ctrl-C) record ``status: interrupted`` with the step, stop the run (and a sweep) and exit
143 / 130; re-running resumes exactly (:mod:`lra.runtime.interrupts`). The lifecycle modules:
:mod:`lra.runtime`.
"""

from __future__ import annotations

from pathlib import Path

import hydra
import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig

from attention.impl import model_forms as attention_forms
from lra.config import CONFIG_DIR
from lra.build import build_datamodule, build_module
from lra.pretrain import pretrain_stage
from lra.pretrain import validate as validate_pretrain
from lra.runtime.checkpoints import load_transferred_weights
from lra.runtime.config_checks import note_exact_landmarks, note_short_warmup, validate
from lra.runtime.config_groups import check_command_line
from lra.runtime.data_checks import DataChecks, note_lost_checkpoints
from lra.runtime.unread_keys import explained
from lra.runtime.gpu_setup import setup_gpu_run
from lra.runtime.job import run_job
from lra.runtime.results import reset_peak_memory, test_accuracies, write_test_predictions
from lra.runtime.run_dir import resume_checkpoint
from lra.runtime.run_end import recording_progress
from lra.runtime.trainer import best_checkpoint, build_loggers, build_trainer


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Fit and test; return the metrics recorded in ``results.json``."""
    validate(cfg)  # compose: the composed config's values, checked before anything is built
    validate_pretrain(cfg)
    note_exact_landmarks(cfg)
    note_short_warmup(cfg)
    setup_gpu_run(cfg)  # TF32 float32 products on a GPU (lra/runtime/gpu_setup.py)

    loggers = build_loggers(cfg)  # instantiate
    init_from, pretrained = cfg.get("init_from"), {}
    if cfg.pretrain.steps:
        init_from, pretrained = pretrain_stage(cfg, run_dir, loggers)
    L.seed_everything(cfg.seed, workers=True)
    datamodule = build_datamodule(cfg)
    module = build_module(cfg)
    if init_from:
        load_transferred_weights(module.model, init_from, cfg.task)
    if cfg.get("finetune"):
        module.model = instantiate(cfg.finetune)(module.model)
    checks = DataChecks(cfg.task.num_classes, cfg.task.vocab_size, cfg.accept_changed_data)  # before step 1
    trainer = build_trainer(cfg, run_dir, loggers, [*(instantiate(node) for node in (cfg.callbacks or {}).values()), checks])
    forms = attention_forms(module.model, trainer.strategy.root_device)  # refuses a form that cannot run there
    print("[lra] forms: " + " ".join(f"{op}={form}" for op, form in forms.items()), flush=True)
    for logger in loggers:
        logger.log_hyperparams({"forms": forms})  # the W&B config records what ran

    resume_from, resumed_from_step = resume_checkpoint(run_dir)  # fit, then test
    if resume_from is None:
        note_lost_checkpoints(run_dir)
    reset_peak_memory()
    with recording_progress(trainer, module) as progress:  # a failed / interrupted record names the step and curve
        trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
        train_time, samples = module.clock.seconds(), module.samples_seen  # before testing loads a checkpoint
        val_curve = progress.fitted()  # testing loads the best checkpoint, whose curve ends at its step
        per_loader = trainer.test(module, datamodule=datamodule, verbose=cfg.verbose,
                                  ckpt_path=best_checkpoint(trainer))
    write_test_predictions(trainer, module, run_dir)

    return {  # record
        "forms": forms,
        "val_acc_best": float(module.val_acc_best.compute()),
        **test_accuracies(per_loader),
        "steps": trainer.global_step,
        "train_time_s": train_time,
        "samples_per_s": samples * trainer.world_size / train_time if train_time > 0 else None,
        "best_checkpoint": best_checkpoint(trainer),
        "resumed_from_step": resumed_from_step,
        "val_curve": val_curve,
        "train_examples": len(datamodule.splits["train"]),
        "data_fingerprint": getattr(datamodule, "data_fingerprint", None),  # lra.tasks.splits.data_fingerprint
        **datamodule.shortcut_record(),
        **pretrained,
    }


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def hydra_main(cfg: DictConfig) -> float | None:
    """:func:`train` as one job of its run dir (:func:`lra.runtime.job.run_job`: the dir claimed, the record
    written, the last line printed); returns the test accuracy (a sweeper's objective)."""
    return run_job(cfg, train)


def main() -> None:
    """``python -m lra.train`` and ``lra-train``: the command line's config-group choices checked first (an unknown
    one is refused before anything is written: :mod:`lra.runtime.config_groups`), then Hydra runs :func:`hydra_main`."""
    check_command_line()
    explained(hydra_main)  # a key=value of a key the config lacks: a did-you-mean line after Hydra's


if __name__ == "__main__":
    main()
