"""A command checked before Hydra writes anything (:class:`StartChecks`, first in ``hydra.callbacks``): each problem
is one ``[lra] FAILED:`` line naming the key or file and what to do, and nothing is run or written.

- a key the command line adds that nothing reads (:mod:`lra.runtime.unread_keys`);
- a config that sweeps (``experiment=cur_table1`` sets ``hydra.sweeper.params``) run without ``-m``: it would train
  one default job;
- ``-m`` with ``hydra.run.dir``: a multirun writes under ``hydra.sweep.dir`` and would ignore it;
- ``hydra.run.dir`` naming a folder that holds files a run writes (``results.json``, ``checkpoints/`` ...) though
  no run of ``lra.train`` made it (:func:`foreign_files`): the run would write over them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from lra.runtime.results import read_results
from lra.runtime.unread_keys import COMPOSED, unread_additions

# What a run of lra.train writes into its run dir (Hydra's .hydra/ and <job>.log included)
WRITTEN = ("results.json", "predictions.json", "config_resolved.yaml", "error.log", "train.log", "checkpoints",
           "csv", "wandb", "pretrain", ".hydra")
# What only a run of lra.train (or Hydra) leaves: a dir holding one of them is a run dir, which a re-run resumes
MARKERS = (".hydra", "config_resolved.yaml", "owner.lock")


def is_run_record(record: Any) -> bool:
    """Whether a ``results.json`` is one ``lra.train`` wrote (its ``status`` and ``config``)."""
    return isinstance(record, dict) and "status" in record and "config" in record


def foreign_files(directory: Path) -> list[str]:
    """The names in ``directory`` a run would write over, where no run of ``lra.train`` made the dir; [] for a
    new or empty dir, one that holds none of :data:`WRITTEN`, or a run dir (:data:`MARKERS`, or an lra record)."""
    directory = Path(directory)
    if not directory.is_dir() or any((directory / name).exists() for name in MARKERS):
        return []
    if is_run_record(read_results(directory)):
        return []
    return [name for name in WRITTEN if (directory / name).exists()]


def given(config: DictConfig, key: str) -> bool:
    """Whether the command line sets Hydra's ``key`` (``hydra.run.dir=...``)."""
    return any(str(o).split("=", 1)[0].lstrip("+") == key for o in OmegaConf.select(config, "hydra.overrides.hydra", default=[]))


def sweep_problem(config: DictConfig) -> str | None:
    """A config that sweeps (``hydra.sweeper.params``, an experiment's table) run as a single job."""
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    if not params:
        return None
    experiment = OmegaConf.select(config, "hydra.runtime.choices.experiment", default=None)
    source = f"experiment={experiment}" if experiment else "this config"
    swept = "; ".join(f"{key}: {value}" for key, value in params.items())
    one = " ".join(f"{key}={str(value).split(',')[0]}" for key, value in params.items())
    return (f"{source} is a sweep ({swept}): without -m it would train one default job. Run it with -m "
            f"(python -m lra.train -m {source} ...); for one job of it, give single values with -m "
            f"(e.g. -m {source} {one})")


def fail(problems: list[str]) -> SystemExit:
    return SystemExit(f"[lra] FAILED: {'; '.join(problems)}. Nothing was run or written.")


class StartChecks(Callback):
    """The checks of the module docstring, before :class:`lra.runtime.run_lock.RunDirOwner` makes the dir."""

    @staticmethod
    def additions(config: DictConfig) -> list[str]:
        """The unread keys the command adds; ``lra.evaluate`` (a ``ckpt_path``) builds the ``attention`` and ``model``
        nodes from the checkpoint's settings, so keys under them are checked when it builds them."""
        overrides = list(config.hydra.overrides.task)
        if "ckpt_path" in config:
            overrides = [o for o in overrides if not o.lstrip("+").startswith(("attention.", "model."))]
        return unread_additions(config, overrides)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        COMPOSED.append(True)
        problems = self.additions(config)
        if (sweep := sweep_problem(config)) is not None:
            problems.append(sweep)
        run_dir = Path(str(config.hydra.run.dir))
        if found := foreign_files(run_dir):
            problems.append(
                f"hydra.run.dir={run_dir} holds {', '.join(found)}, which no run of lra.train wrote (it has no "
                f".hydra/, config_resolved.yaml or owner.lock): a run would write over them. Give a new or empty dir "
                f"(hydra.run.dir=<new dir>), or drop hydra.run.dir for a fresh one")
        if problems:
            raise fail(problems)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        COMPOSED.append(True)
        problems = self.additions(config)
        if given(config, "hydra.run.dir"):
            problems.append(f"-m (a multirun) writes its jobs under hydra.sweep.dir and would ignore hydra.run.dir: "
                            f"give hydra.sweep.dir=<dir> instead (re-running a sweep into the same hydra.sweep.dir "
                            f"runs only its unfinished jobs), or drop -m for a single run")
        if problems:
            raise fail(problems)
