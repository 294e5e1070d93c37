"""Hydra callbacks: name an output dir that cannot be written before Hydra's log file fails on it; check a
sweep before its first job starts and record its jobs as ``not_started``; after it, exit non-zero naming
every job that did not complete.

Hydra turns an exception raised by a callback into a warning, so these callbacks end the process
with ``SystemExit`` (exit code 1, message on stderr) instead.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from lra.runtime.config_groups import closest

log = logging.getLogger(__name__)


def sweep_overrides(config: DictConfig) -> list[str]:
    """Command-line overrides plus the ``hydra.sweeper.params`` of the config (an experiment's sweep)."""
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    return [*OmegaConf.select(config, "hydra.overrides.task", default=[]), *(f"{k}={v}" for k, v in params.items())]


def missing_options(overrides: list[str], group_options: Callable[[str], list[str]]) -> list[str]:
    """One message per override value that names a config-group option with no config file.

    ``group_options(group)`` lists the options of a config group (empty for a plain value such as
    ``seed``, which is not checked). Works for single values and sweeps (``attention=a,b``).
    """
    problems = []
    for override in OverridesParser.create().parse_overrides(overrides):
        group = override.key_or_group
        options = group_options(group)
        if not options or override.is_delete():
            continue
        values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.get_value_element_as_str()]
        for value in values:
            if value not in options:
                near = closest(value, options)
                problems.append(
                    f"{group}={value}: no config 'configs/{group}/{value}.yaml' (not implemented yet?"
                    f"{f' did you mean {group}={near}?' if near else ''}). "
                    f"Available: {', '.join(sorted(options))}. Add the config or drop '{value}' from the sweep "
                    f"(override it on the command line, e.g. {group}={','.join(v for v in values if v in options) or '...'})."
                )
    return problems


def hydra_group_options(config: DictConfig) -> Callable[[str], list[str]]:
    """``group -> options`` in the running Hydra's search path, including ``hydra.searchpath`` additions."""
    loader = GlobalHydra.instance().config_loader()
    hydra_overrides = [str(o) for o in OmegaConf.select(config, "hydra.overrides.hydra", default=[])]
    config_name = OmegaConf.select(config, "hydra.job.config_name", default=None)

    def options(group: str) -> list[str]:
        if not loader.repository.group_exists(group) and not any("searchpath" in o for o in hydra_overrides):
            return []
        return loader.get_group_options(group, config_name=config_name, overrides=hydra_overrides)

    return options


def local_ddp_problem(config: DictConfig) -> str | None:
    """Lightning's popen DDP launcher re-runs ``sys.argv`` (the whole sweep) for each rank: refuse it in a local multirun."""
    start_method = OmegaConf.select(config, "trainer.strategy.start_method", default=None)
    launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
    if start_method == "popen" and "SlurmLauncher" not in launcher:
        return (
            "trainer.strategy (DDP, start_method popen) cannot run inside a local multirun: Lightning would re-launch "
            "the whole sweep for every rank. Run DDP jobs one at a time (python -m lra.train trainer=ddp_cpu ...), "
            "or sweep on SLURM (hydra/launcher=submitit_slurm), where srun starts the ranks."
        )
    return None


def sweep_batch(config: DictConfig) -> list[list[str]] | None:
    """The overrides of every job the basic sweeper will launch, in its order (job ``k`` is item ``k``), or None
    for another sweeper (its jobs are not known in advance).

    Mirrors ``BasicSweeper.sweep``: ``hydra.sweeper.params`` first, then the command line, crossed."""
    if not str(OmegaConf.select(config, "hydra.sweeper._target_", default="")).endswith("BasicSweeper"):
        return None
    loader = GlobalHydra.instance().config_loader()
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    arguments = [*(f"{k}={v}" for k, v in params.items()), *OmegaConf.select(config, "hydra.overrides.task", default=[])]
    (batch,) = BasicSweeper.split_arguments(OverridesParser.create(config_loader=loader).parse_overrides(arguments), None)
    return [list(overrides) for overrides in batch]


def sweep_jobs(config: DictConfig) -> list[tuple[Path, DictConfig]]:
    """(job dir, job config) of every job of :func:`sweep_batch`, each composed as the launcher does
    (``load_sweep_config`` with ``hydra.job.num`` set). Empty for another sweeper."""
    loader = GlobalHydra.instance().config_loader()
    sweep_dir = Path(str(config.hydra.sweep.dir))  # resolved (and ${now:} cached) in the config the launcher reads
    jobs = []
    for num, overrides in enumerate(sweep_batch(config) or []):
        job = loader.load_sweep_config(config, overrides)
        with open_dict(job):
            job.hydra.job.id = job.hydra.job.num = num
        jobs.append((sweep_dir / str(job.hydra.sweep.subdir), job))
    return jobs


def record_not_started(config: DictConfig) -> int:
    """Write ``results.json`` with ``status: not_started`` into every job dir of the sweep that has none
    (a job deletes it when it starts), so a sweep stopped early still lists its jobs that never ran."""
    try:
        jobs = sweep_jobs(config)
    except Exception as error:  # a job that cannot compose: the sweeper reports it itself
        log.warning("could not list the sweep's jobs to record them as not started: %s", error)
        return 0
    written = 0
    for job_dir, job in jobs:
        path = job_dir / "results.json"
        if path.exists():
            continue
        job_config = {k: v for k, v in OmegaConf.to_container(job, resolve=False).items() if k != "hydra"}
        record = {
            "task": OmegaConf.select(job, "task.name", default=None), "attention": OmegaConf.select(job, "attention.name", default=None),
            "seed": OmegaConf.select(job, "seed", default=None), "status": "not_started",
            "error": "not started (the sweep stopped before this job)", "steps": None,
            "overrides": list(job.hydra.overrides.task), "config": job_config,
        }
        job_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2, default=str))
        written += 1
    return written


def unfinished_jobs(sweep_dir: Path) -> list[str]:
    """``<job dir>: <status>: <error>`` for every ``results.json`` under ``sweep_dir`` that is not completed,
    and for every completed one whose job was re-run with other overrides (the record was kept)."""
    lines = []
    for path in sorted(Path(sweep_dir).rglob("results.json")):
        record = json.loads(path.read_text())
        status = record.get("status")
        if status != "completed":
            step = f" at step {record['steps']}" if record.get("steps") is not None and status != "not_started" else ""
            lines.append(f"{path.parent}: {status}{step}: {record.get('error', '')}")
            continue
        asked = path.parent / ".hydra" / "overrides.yaml"
        if asked.exists() and sorted(yaml.safe_load(asked.read_text()) or []) != sorted(record.get("overrides") or []):
            lines.append(f"{path.parent}: not re-run: it holds a completed run of other overrides "
                         f"({' '.join(record.get('overrides') or [])}); sweep into a new hydra.sweep.dir")
    return lines


def require_writable(directory: Path, key: str) -> None:
    """Create ``directory`` and write a scratch file in it, or exit naming the dir, the config ``key`` and the cause."""
    existed = directory.is_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=directory, prefix=".write-check-")
        try:
            os.write(handle, b"x")  # a full disk still lets an empty file be made
            os.fsync(handle)
        finally:
            os.close(handle)
            os.unlink(probe)
    except OSError as error:
        if not existed:  # leave no empty run dir behind
            try:
                directory.rmdir()
            except OSError:
                pass
        raise unwritable(directory, key, error) from None


def unwritable(directory: Path, key: str, error: OSError) -> SystemExit:
    """The one ``[lra] FAILED:`` line for an output dir that cannot be written at start-up (a read-only mount, a full
    disk, a file in the path), naming the dir, its config key, the cause and what to do."""
    return SystemExit(f"[lra] FAILED: cannot write the output dir {directory} ({key}): {error.strerror or error}. "
                      f"Nothing was run. Choose a writable dir ({key}=<dir>, or paths.log_dir=<dir>) "
                      f"or make this one writable (read-only mount? full disk? a file in the path?)")


class WritableOutputDir(Callback):
    """Before a run or sweep: its output dir must be writable (Hydra's own error, "Unable to configure
    handler 'file'", names neither the dir nor the cause)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        require_writable(Path(str(config.hydra.run.dir)), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        require_writable(Path(str(config.hydra.sweep.dir)), "hydra.sweep.dir")


class FailOnFailedJobs(Callback):
    """Before a multirun: every swept config-group option must exist and DDP must be launchable; then
    every job dir without a ``results.json`` gets one with ``status: not_started``.
    After it: read every ``results.json`` under the sweep dir and exit 1 if any job did not complete."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        problems = missing_options(sweep_overrides(config), hydra_group_options(config))
        ddp = local_ddp_problem(config)
        problems += [ddp] if ddp else []
        if problems:
            raise SystemExit("Sweep not started:\n  " + "\n  ".join(problems))
        record_not_started(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        unfinished = unfinished_jobs(sweep_dir)
        if unfinished:
            raise SystemExit(f"{len(unfinished)} job(s) of the sweep in {sweep_dir} failed or did not complete "
                             f"(re-run the same command with hydra.sweep.dir={sweep_dir} to run only these):\n  "
                             + "\n  ".join(unfinished))
