"""One job of ``lra.train`` from its first console line to its exit code: :func:`run_job` around the training.

In order:

1. the run dir is printed (with the code's commit) and locked (:mod:`lra.runtime.run_lock`; a sweep job locks its
   own dir here, a single run already holds it); SIGTERM and SIGINT are recorded from here on, wherever they land;
2. a run dir that already holds a completed run is not trained again (:func:`already_completed`);
3. a command whose settings are not those of the dir's checkpoints is refused before anything is written
   (:func:`lra.runtime.run_dir.check_resume`); otherwise it claims the dir (:func:`lra.runtime.run_dir.claim`);
4. the training runs; its metrics become ``results.json`` with ``status: completed``;
5. a failure records ``status: failed`` and ``error.log`` (a sweep goes on, and exits non-zero at its end); SIGTERM
   (preemption) and SIGINT (Ctrl-C) record ``status: interrupted`` with the step and stop the run, and a sweep,
   with exit 143 / 130; re-running resumes exactly (:mod:`lra.runtime.run_end`, :mod:`lra.runtime.interrupts`);
6. the W&B run is closed and the lock released, then the last line is printed: the test accuracy and where the
   record is, ``[lra] INTERRUPTED ...`` or ``[lra] FAILED: <error>``.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Callable

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf, open_dict

from lra.runtime.hydra_callbacks import unfinished_jobs
from lra.runtime.interrupts import STOP_SIGNALS
from lra.runtime.results import git_commit, job_overrides, read_results, write_results
from lra.runtime.run_dir import ResumeRefused, check_resume, claim, drop_unused_pretrain, settings_differences
from lra.runtime.run_end import failure, interruption
from lra.runtime.run_lock import RunDirInUse, hold, release
from lra.runtime.wandb_summary import finish_wandb


def run_job(cfg: DictConfig, train: Callable[[DictConfig, Path], dict]) -> float | None:
    """Run ``train(cfg, run_dir)`` as this Hydra job (steps 1-6 of the module docstring); return its test accuracy
    (None for a failed job or a refused one of a sweep), or exit with the code of a failure or an interruption."""
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
    if not multirun:  # a resume names the whole command: `make train` passes none of its overrides on a re-run
        same_dir = f"hydra.run.dir={hydra_value(str(run_dir))}"
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
        if not multirun:
            message += f"; the command: {resume_command(run_dir)}"
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


def hydra_value(text: str) -> str:
    """``text`` as a Hydra override value: as it is where Hydra reads it back unchanged, else quoted (a non-ASCII
    character or a bracket ends an unquoted value: ``hydra.run.dir="/tmp/é"``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        if OverridesParser.create().parse_override(f"key={text}").value() == text:
            return text
    except Exception:
        pass
    return f'"{text}"' if '"' not in text else "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def resume_command(run_dir: Path) -> str:
    """The ``python -m lra.train`` command that resumes this run, quoted for a shell (``shlex``): this job's
    overrides and ``hydra.run.dir`` (what ``make train`` cannot pass on)."""
    return shlex.join(["python", "-m", "lra.train", *job_overrides(), f"hydra.run.dir={hydra_value(str(run_dir))}"])
