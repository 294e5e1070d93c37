"""Hydra callbacks: check a sweep before its first job starts; after it, exit non-zero naming failed jobs.

Hydra turns an exception raised by a callback into a warning, so these callbacks end the process
with ``SystemExit`` (exit code 1, message on stderr) instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


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
                problems.append(
                    f"{group}={value}: no config 'configs/{group}/{value}.yaml' (not implemented yet?). "
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


class FailOnFailedJobs(Callback):
    """Before a multirun: every swept config-group option must exist and DDP must be launchable.
    After it: read every ``results.json`` under the sweep dir and exit 1 if any job failed."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        problems = missing_options(sweep_overrides(config), hydra_group_options(config))
        ddp = local_ddp_problem(config)
        problems += [ddp] if ddp else []
        if problems:
            raise SystemExit("Sweep not started:\n  " + "\n  ".join(problems))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        failed = []
        for path in sorted(sweep_dir.rglob("results.json")):
            record = json.loads(path.read_text())
            if record.get("status") != "completed":
                failed.append(f"{path.parent}: {record.get('error', record.get('status'))}")
        if failed:
            raise SystemExit(f"{len(failed)} job(s) of the sweep in {sweep_dir} failed:\n  " + "\n  ".join(failed))
