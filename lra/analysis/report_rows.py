"""Report rows: one per (task, attention, setting), its runs one per seed.

Runs of one task, attention and setting (:mod:`lra.analysis.report_settings`) are the seeds of one row. Two
runs of the same row and seed (one sweep found twice, a job re-run into another dir) are one result: the
newest (``results.json`` written last) is kept and a warning names both dirs. A row's ``shown`` parts are
the setting parts not shared by every row of its task (what its ``setting`` cell names); the shared ones go
under the task's table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lra.analysis.report_runs import warn
from lra.analysis.report_settings import DATA, FORMS, Part, setting_parts


@dataclass
class Row:
    task: str
    attention: str
    parts: tuple[Part, ...]
    runs: list[dict] = field(default_factory=list)
    shown: tuple[Part, ...] = ()

    def completed(self) -> list[dict]:
        return [run for run in self.runs if run["status"] == "completed"]

    def status_count(self, *statuses: str) -> int:
        return sum(run["status"] in statuses for run in self.runs)

    def values(self, key: str) -> list[float]:
        return [run[key] for run in self.completed() if run.get(key) is not None]

    def seeds(self) -> int:
        """Distinct seeds among the completed runs."""
        return len({run["seed"] for run in self.completed()})

    @property
    def plain(self) -> bool:
        """Trained with the task's plain recipe (on whatever data): no setting part but the data dir."""
        return all(part.key in (DATA, FORMS) for part in self.parts)

    @property
    def data(self) -> str | None:
        """The data dir's identity when the runs override it (``data/listops_full``), else None (the recipe's)."""
        return next((part.value for part in self.parts if part.key == DATA), None)

    def setting(self) -> str:
        """The setting cell: the parts of :attr:`shown`, e.g. ``positions=rotary · pretrain 2,500``."""
        return " · ".join(part.text for part in self.shown)

    def label(self) -> str:
        """``attention`` and its setting cell, e.g. ``curformer selection=sum`` (what ``--baseline`` names)."""
        return " ".join(filter(None, (self.attention, self.setting())))


def newest_per_seed(row: Row) -> None:
    """Keep one run per seed of ``row``, the newest; warn naming the dirs of the others."""
    by_seed: dict = {}
    for run in row.runs:
        by_seed.setdefault(run["seed"], []).append(run)
    kept = []
    for seed, runs in by_seed.items():
        newest = max(runs, key=lambda run: (run.get("written") or 0.0, run["path"]))
        kept.append(newest)
        if len(runs) > 1:
            others = ", ".join(run["path"] for run in runs if run is not newest)
            warn(f"duplicate runs of {row.task} / {row.label()} / seed {seed}: {newest['path']} and {others}; "
                 f"reporting the newest, {newest['path']}")
    row.runs = kept


def group_runs(runs: list[dict]) -> tuple[list[Row], dict[str, tuple[Part, ...]]]:
    """Rows (sorted by task, attention, plain recipe first, setting) and per task the parts every row shares."""
    rows: dict[tuple, Row] = {}
    for run in runs:
        parts = setting_parts(run)
        key = (str(run["task"]), str(run["attention"]), tuple((part.key, part.value) for part in parts))
        rows.setdefault(key, Row(str(run["task"]), str(run["attention"]), parts)).runs.append(run)
    common = {}
    for task in sorted({row.task for row in rows.values()}):
        of_task = [row for row in rows.values() if row.task == task]
        shared = set.intersection(*({(part.key, part.value) for part in row.parts} for row in of_task))
        common[task] = tuple(part for part in of_task[0].parts if (part.key, part.value) in shared)
        for row in of_task:
            row.shown = tuple(part for part in row.parts if (part.key, part.value) not in shared)
        for attention in {row.attention for row in of_task}:  # forms are named only where one variant's rows differ
            rows_of = [row for row in of_task if row.attention == attention]
            if len({part.value for row in rows_of for part in row.parts if part.key == FORMS}) <= 1:
                for row in rows_of:
                    row.shown = tuple(part for part in row.shown if part.key != FORMS)
    ordered = sorted(rows.values(), key=lambda row: (row.task, row.attention, not row.plain, row.setting()))
    for row in ordered:
        newest_per_seed(row)
    return ordered, common
