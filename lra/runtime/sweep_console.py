"""A sweep's console (configs/hydra/default.yaml ``sweep_console``): a line before each job of a multirun,
``[lra] job 2 of 4: attention=softmax seed=1`` (the overrides that differ between the sweep's jobs), and one
table of the jobs when the sweep ends::

    [lra] sweep outputs/multirun/2026-11-27_10-00-00-000000: 4 jobs, 3 completed, 1 failed
    | job | attention | seed | status    | test acc | run dir                      |
    |----:|-----------|------|-----------|---------:|------------------------------|
    |   1 | softmax   | 0    | completed |   0.1560 | 0_listops_small_softmax_s0   |

The jobs and their order come from the basic sweeper's overrides (:func:`lra.runtime.hydra_callbacks.sweep_batch`,
read once in the launching process, before the first job; the launchers hand this callback to the job
processes with it). Each row is the ``results.json`` whose ``overrides`` are the job's: its status, test
accuracy and dir; ``missing`` where no job dir holds one (a job killed outright). With another sweeper the
jobs are not known in advance: the lines say ``job k`` and the table lists the records found.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from lra.runtime.hydra_callbacks import sweep_batch


def override_key(override: str) -> str:
    return override.split("=", 1)[0]


def swept_keys(batch: list[list[str]]) -> list[str]:
    """The override keys whose values differ between the jobs, in their order on the command line."""
    values: dict[str, set[str]] = {}
    for overrides in batch:
        for override in overrides:
            values.setdefault(override_key(override), set()).add(override)
    return [key for key, seen in values.items() if len(seen) > 1]


def markdown_table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """A markdown table with its columns padded to their widest cell (columns in ``right`` right-aligned)."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"
    rule = "|" + "|".join("-" * (w + 1) + ":" if i in right else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return [line(header), rule, *map(line, rows)]


def accuracy(record: dict | None, key: str) -> str:
    value = (record or {}).get(key)
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"


def summary(sweep_dir: Path, batch: list[list[str]] | None) -> list[str]:
    """The sweep's closing lines: a count per status and one row per job (module docstring)."""
    found = {}
    for path in sorted(sweep_dir.rglob("results.json")):
        record = json.loads(path.read_text())
        found[tuple(sorted(record.get("overrides") or []))] = (path.parent, record)
    if batch is None:
        jobs, keys = [record.get("overrides") or [] for _, record in found.values()], []
    else:
        jobs, keys = batch, swept_keys(batch)
    rows = [found.get(tuple(sorted(overrides)), (None, None)) for overrides in jobs]
    statuses = Counter(record.get("status") if record else "missing" for _, record in rows)
    independent = any("independent_test_acc" in (record or {}) for _, record in rows)
    header = ["job", *keys, "status", "test acc", *(["independent test acc"] if independent else []), "run dir"]
    cells = []
    for number, (overrides, (job_dir, record)) in enumerate(zip(jobs, rows), start=1):
        values = {override_key(override): override.split("=", 1)[-1] for override in overrides}
        cells.append([str(number), *(values.get(key, "-") for key in keys), record.get("status") if record else "missing",
                      accuracy(record, "test_acc"), *([accuracy(record, "independent_test_acc")] if independent else []),
                      str(job_dir.relative_to(sweep_dir)) if job_dir else "-"])
    right = {0, len(keys) + 2, len(keys) + 3} if independent else {0, len(keys) + 2}
    counts = ", ".join(f"{count} {status}" for status, count in statuses.items())
    return [f"[lra] sweep {sweep_dir}: {len(jobs)} jobs, {counts}", *markdown_table(header, cells, right)]


class SweepConsole(Callback):
    """``job k of N`` before each job of a multirun, the table of its jobs after it (module docstring)."""

    def __init__(self) -> None:
        self.batch: list[list[str]] | None = None  # every job's overrides, read before the first job

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.batch = sweep_batch(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        overrides = list(config.hydra.overrides.task)
        if self.batch is None:
            line = f"[lra] job {config.hydra.job.num + 1}: {' '.join(overrides)}"
        else:
            keys = swept_keys(self.batch)
            swept = " ".join(override for override in overrides if override_key(override) in keys)
            line = f"[lra] job {config.hydra.job.num + 1} of {len(self.batch)}" + (f": {swept}" if swept else "")
        sys.stdout.write(f"{line}\n")  # one write: jobs of a parallel launcher share the terminal
        sys.stdout.flush()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        print("\n".join(summary(Path(str(config.hydra.sweep.dir)), self.batch)), flush=True)
