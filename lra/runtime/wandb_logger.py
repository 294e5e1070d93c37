"""Lightning's ``WandbLogger`` with one line for W&B's banner (``logger=wandb``, configs/logger/wandb.yaml).

W&B prints five lines when a run starts and about twenty when it ends (history sparklines, summary, where the
files are, how to sync). Unless ``verbose`` it is silenced (``wandb.Settings(silent=True)``, which also
silences W&B's warnings) and this logger prints one line when the run is created:
``[lra] W&B: offline run; `wandb sync <dir>` uploads it`` (online: the run's URL).
It also leaves out the ``anonymous`` argument Lightning 2.6 always passes, even as None, which wandb 0.31
answers with a warning that the setting has no effect.

One training is one W&B run across any number of stops and resumes: a run dir whose ``wandb/`` holds a run of an
earlier part reopens it (its id, ``resume="allow"``), logs only the points (metric, ``trainer/global_step``) it
does not hold yet (a resume redoes the steps after its checkpoint: bit-identical, so they are left out) and numbers
its history rows on from the earlier parts' (``_step``), so ``wandb sync`` of every part gives one run whose
history holds each step once (:mod:`lra.runtime.wandb_history` reads the parts offline).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.logger import _add_prefix
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.utilities import rank_zero_only

from lra.runtime.wandb_history import history, logged_points, run_folders, run_id


class WandbLogger(LightningWandbLogger):
    """``WandbLogger(**kwargs)`` with W&B silent unless ``verbose``, announcing its run in one line."""

    def __init__(self, verbose: bool = False, **kwargs: Any):
        import wandb

        wandb_dir = Path(kwargs.get("save_dir") or kwargs.get("dir") or ".") / "wandb"
        earlier = None if kwargs.get("id") or kwargs.get("version") else run_id(wandb_dir)
        super().__init__(settings=wandb.Settings(silent=not verbose), **{**kwargs, **({"id": earlier} if earlier else {})})
        del self._wandb_init["anonymous"]
        self._logged: set[tuple[str, int]] = set()  # the points the earlier parts of this run logged
        self._next_step: int | None = None  # the history row number after theirs
        if earlier:
            self._logged = logged_points(wandb_dir, earlier)
            steps = [row.get("_step", -1) for folder in run_folders(wandb_dir) for path in folder.glob("run-*.wandb")
                     for row in history(path)]
            self._next_step = max(steps, default=-1) + 1

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Lightning's, without the points the earlier parts of the run logged, in rows numbered after theirs."""
        if self._next_step is None:
            return super().log_metrics(metrics, step)
        metrics = _add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR)
        new = {key: value for key, value in metrics.items() if (key, step) not in self._logged}
        if not new:
            return
        self.experiment.log(dict(new, **({"trainer/global_step": step} if step is not None else {})),
                            step=self._next_step)
        self._next_step += 1

    @property
    def experiment(self):
        created = self._experiment is None
        run = super().experiment
        if created and self._experiment is not None:  # made just now, on global rank 0 (elsewhere: a dummy)
            where = f"offline run; `wandb sync {run.settings.sync_dir}` uploads it" if self._offline else run.url
            print(f"[lra] W&B: {where}", flush=True)
        return run
