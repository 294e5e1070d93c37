"""Lightning's ``WandbLogger`` with one line for W&B's banner (``logger=wandb``, configs/logger/wandb.yaml).

W&B prints five lines when a run starts and about twenty when it ends (history sparklines, summary, where the
files are, how to sync). Unless ``verbose`` it is silenced (``wandb.Settings(silent=True)``, which also
silences W&B's warnings) and this logger prints one line when the run is created:
``[lra] W&B: offline run; `wandb sync <dir>` uploads it`` (online: the run's URL).
It also leaves out the ``anonymous`` argument Lightning 2.6 always passes, even as None, which wandb 0.31
answers with a warning that the setting has no effect.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger


class WandbLogger(LightningWandbLogger):
    """``WandbLogger(**kwargs)`` with W&B silent unless ``verbose``, announcing its run in one line."""

    def __init__(self, verbose: bool = False, **kwargs: Any):
        import wandb

        super().__init__(settings=wandb.Settings(silent=not verbose), **kwargs)
        del self._wandb_init["anonymous"]

    @property
    def experiment(self):
        created = self._experiment is None
        run = super().experiment
        if created and self._experiment is not None:  # made just now, on global rank 0 (elsewhere: a dummy)
            where = f"offline run; `wandb sync {run.settings.sync_dir}` uploads it" if self._offline else run.url
            print(f"[lra] W&B: {where}", flush=True)
        return run
