"""Evaluate a checkpoint, as trained or with any drop-in attention, no training (direct weight transfer).

``python -m lra.evaluate ckpt_path=<ckpt> task=<t> [task.data_dir=D] [attention=<a>] [attention.*=...]``
composes ``configs/evaluate.yaml`` (train.yaml plus ``ckpt_path``), builds the model with the attention
and model settings stored in the checkpoint (:func:`lra.runtime.checkpoints.with_checkpoint_settings`; a group named on the
command line replaces them, so ``attention=<a>`` transfers the weights to another attention), loads the checkpoint's weights (:func:`lra.runtime.checkpoints.load_transferred_weights`: strict
on shared parameters, naming any skipped or freshly initialised one), tests it and writes
``<run dir>/results.json`` with ``test_acc`` (and ``independent_test_acc`` where the data holds it, and the
task's shortcut on each tested split, ``shortcut_<split>_acc``),
``transferred_from``, ``skipped`` and ``initialised``, and ``predictions.json`` beside it.
This is CUR paper Table 3 (MEGA -> MegaCUR) and §8 (softmax ViT -> CUR) without fine-tuning; for
fine-tuning, train with ``init_from=<ckpt>``. Run dirs go under ``outputs/evaluations/`` (not
``outputs/runs/``), so a report of training runs never mixes evaluations in. A ``ckpt_path`` that is no file (or
none) is refused before a run dir is made (:func:`check_checkpoint`); any other failure ends in one
``[lra] FAILED:`` line, its traceback in ``<run dir>/error.log`` (:func:`lra.runtime.run_end.failure`).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from lra.runtime.checkpoints import load_transferred_weights, with_checkpoint_settings
from lra.config import CONFIG_DIR
from lra.runtime.config_groups import check_command_line, chosen_values
from lra.runtime.interrupts import STOP_SIGNALS, STOPPING_SIGNALS, exit_code
from lra.runtime.unread_keys import explained
from lra.build import build_module
from lra.runtime.results import job_overrides, test_accuracies, write_results, write_test_predictions
from lra.runtime.run_end import failure
from lra.runtime.trainer import build_trainer
from lra.runtime.wandb_summary import finish_wandb


def evaluate(cfg: DictConfig, run_dir: Path) -> dict:
    """Load ``cfg.ckpt_path`` into the configured model, test it; return the ``results.json`` metrics."""
    L.seed_everything(cfg.seed, workers=True)
    module = build_module(cfg)
    transfer = load_transferred_weights(module.model, cfg.ckpt_path, cfg.task)
    datamodule = instantiate(cfg.task.datamodule)
    trainer = build_trainer(cfg, run_dir)
    started = time.perf_counter()
    accuracies = test_accuracies(trainer.test(module, datamodule=datamodule, verbose=cfg.verbose))
    write_test_predictions(trainer, module, run_dir)
    return {
        **accuracies,
        **datamodule.shortcut_record(),
        "steps": 0,
        "eval_time_s": time.perf_counter() - started,
        "transferred_from": str(Path(cfg.ckpt_path).resolve()),
        **transfer,
    }


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="evaluate")
def hydra_main(cfg: DictConfig) -> float:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    print(f"[lra] run dir: {run_dir}", flush=True)
    failed = interrupted = None
    STOP_SIGNALS.install()  # Ctrl-C / SIGTERM: the test batch in flight ends, then a record and one line
    try:
        cfg = with_checkpoint_settings(cfg, job_overrides(), cfg.ckpt_path)
        metrics = evaluate(cfg, run_dir)
    except SIGTERMException:
        signum = STOP_SIGNALS.received or signal.SIGTERM
        path = write_results(run_dir, cfg, "interrupted", error=f"{STOPPING_SIGNALS[signum]}: not evaluated to the end",
                             transferred_from=str(cfg.ckpt_path))
        interrupted = (f"[lra] INTERRUPTED by {STOPPING_SIGNALS[signum]} during the evaluation: {path} records it; "
                       f"nothing else was kept (an evaluation does not resume): re-run the command to evaluate "
                       f"again", exit_code(signum))
    except Exception as error:  # one [lra] FAILED: line, printed last; the traceback in <run dir>/error.log
        failed = failure(run_dir, cfg, error, True, cfg.get("verbose") or HydraConfig.get().verbose,
                         transferred_from=str(cfg.ckpt_path))
    else:  # before `finally`: the record also goes into the W&B run's summary, which finish_wandb closes
        path = write_results(run_dir, cfg, "completed", **metrics)
    finally:
        finish_wandb()
    if interrupted is not None:
        print(interrupted[0], file=sys.stderr, flush=True)
        raise SystemExit(interrupted[1])
    if failed is not None:
        print(failed, file=sys.stderr, flush=True)
        raise SystemExit(1)
    print(f"[lra] {cfg.attention.name} on {cfg.task.name} from {cfg.ckpt_path}: test acc {metrics['test_acc']:.4f}; "
          f"results: {path}", flush=True)
    return metrics["test_acc"]


def check_checkpoint(argv: list[str] | None = None) -> None:
    """Exit with one ``[lra] FAILED:`` line, before Hydra makes a run dir, when the command names no ``ckpt_path``
    or one that is not a file (each of a sweep's). Commands that only print (``--help``, ``--cfg``, ``--info``)
    pass."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        args = get_args_parser().parse_args(sys.argv[1:] if argv is None else argv)
        overrides = OverridesParser.create().parse_overrides(args.overrides or [])
    except (SystemExit, Exception):  # Hydra reports its own usage and parse errors
        return
    if args.help or args.hydra_help or args.cfg or args.info is not None or args.shell_completion:
        return
    paths = [value for override in overrides if override.key_or_group == "ckpt_path" for value in chosen_values(override)]
    example = "python -m lra.evaluate ckpt_path=<run dir>/checkpoints/best-<step>.ckpt task=<task>"
    if not paths:
        raise SystemExit(f"[lra] FAILED: no ckpt_path given: {example} (results.json's best_checkpoint names a run's "
                         f"best). Nothing was written.")
    missing = [path for path in paths if not Path(path).is_file()]
    if missing:
        raise SystemExit(f"[lra] FAILED: ckpt_path={missing[0]}: no such file. Give a checkpoint of a run of lra.train "
                         f"(<run dir>/checkpoints/best-<step>.ckpt or last.ckpt; results.json's best_checkpoint names "
                         f"the best): {example}. Nothing was written.")


def main() -> None:
    """``python -m lra.evaluate`` and ``lra-evaluate``: the command line checked first (config-group choices,
    :mod:`lra.runtime.config_groups`; the checkpoint, :func:`check_checkpoint`), then Hydra runs :func:`hydra_main`."""
    check_command_line()
    check_checkpoint()
    explained(hydra_main)  # a key=value of a key the config lacks: a did-you-mean line after Hydra's


if __name__ == "__main__":
    main()
