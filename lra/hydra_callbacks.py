"""Hydra callbacks: a sweep keeps going past a failed job, then exits non-zero naming the failures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class FailOnFailedJobs(Callback):
    """After a multirun, read every ``results.json`` under the sweep dir and raise if any job failed."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        failed = []
        for path in sorted(sweep_dir.rglob("results.json")):
            record = json.loads(path.read_text())
            if record.get("status") != "completed":
                failed.append(f"{path.parent}: {record.get('error', record.get('status'))}")
        if failed:
            raise RuntimeError(f"{len(failed)} job(s) of the sweep in {sweep_dir} failed:\n  " + "\n  ".join(failed))
