"""Render :func:`lra.analysis.report.summarize`'s rows: one compact table per task (Markdown or LaTeX), or CSV.

A task's table shows only what tells its rows apart or what was measured: setting columns whose
value is the same for every row of the task move to a line under the table, count columns
(failed / interrupted / missing) appear only when a run is not completed, and metric columns that
no row has (no independent test, no shortcut, no published number, no paired test) are left out.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[dict], str]
    shown: Callable[[list[dict]], bool] = lambda rows: True


def fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def mean_std(row: dict, key: str) -> str:
    mean, std = row[f"{key}_mean"], row[f"{key}_std"]
    return "-" if mean is None else fmt(mean) + (f" ± {fmt(std)}" if std is not None else "")


def any_of(key: str) -> Callable[[list[dict]], bool]:
    return lambda rows: any(row.get(key) not in (None, 0) for row in rows)


def short(value: str) -> str:
    """A setting as a table cell: a path by its last component (the table names settings, not folders)."""
    return Path(value).name if "/" in value and "=" not in value else value


COLUMNS = (
    Column("seeds", lambda r: str(r["seeds"])),
    Column("failed", lambda r: str(r["failed"]), any_of("failed")),
    Column("interrupted", lambda r: str(r["interrupted"]), any_of("interrupted")),
    Column("missing", lambda r: str(r["missing"]), any_of("missing")),
    Column("test %", lambda r: mean_std(r, "test_acc")),
    Column("independent test %", lambda r: mean_std(r, "independent_test_acc"), any_of("independent_test_acc_mean")),
    Column("shortcut test %", lambda r: fmt(r["cue_test"]), any_of("cue_test")),
    Column("shortcut indep. %", lambda r: fmt(r["cue_independent_test"]), any_of("cue_independent_test")),
    Column("published %", lambda r: r["published_note"] or fmt(r["published"]), any_of("published_table")),
    Column("Δ", lambda r: "-" if r["delta"] is None else f"{r['delta']:+.2f}", any_of("published_table")),
    Column("source", lambda r: r["published_table"] or "-", any_of("published_table")),
    Column("p (McNemar)", lambda r: "baseline" if r["baseline"] == r["label"] else
           "-" if r["p_value"] is None else f"{r['p_value']:.2g}" if r["p_value"] > 0 else "< 1e-300",
           lambda rows: any(row["p_value"] is not None for row in rows)),
    Column("best val %", lambda r: fmt(r["val_acc_best_mean"])),
    Column("steps", lambda r: fmt(r["steps"])),
    Column("train min", lambda r: fmt(r["train_time_min"], 0)),
    Column("samples/s", lambda r: fmt(r["samples_per_s"], 1)),
    Column("peak MiB", lambda r: fmt(r["peak_mem_mib"], 0)),
)


def task_table(rows: list[dict], settings: list[str]) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, body and the notes under one task's table."""
    varying = [key for key in settings if len({row[key] for row in rows}) > 1]
    notes = [f"all rows: {', '.join(f'{key}={short(rows[0][key])}' for key in settings if key not in varying)}"] \
        if len(varying) < len(settings) else []
    columns = [column for column in COLUMNS if column.shown(rows)]
    header = ["attention", *varying, *(column.header for column in columns)]
    body = [[row["attention"], *(short(row[key]) for key in varying), *(column.cell(row) for column in columns)]
            for row in rows]
    if any(row["p_value"] is not None for row in rows):
        paired = next(row for row in rows if row["p_value"] is not None)
        notes.append(f"p (McNemar): exact two-sided test against `{paired['baseline']}` on the same examples "
                     f"({paired['paired_on']})")
    if shortcut := next((row["shortcut"] for row in rows if row.get("shortcut")), None):
        notes.append(f"shortcut: {shortcut}")
    if varying:
        notes.append("-: the setting's config default (the row's runs do not override it)")
    if any(row["delta"] is not None and row["independent_test_acc_mean"] is not None for row in rows):
        notes.append("Δ: the independent-test mean (the test mean where a row has no independent test) minus the "
                     "published number")
    return header, body, notes


def render(summary: list[dict], settings: dict[str, list[str]], runs: list[dict], tables: dict, form: str) -> str:
    """The tables as Markdown (runs not completed and the published sources listed below), CSV (raw numbers,
    one row per report row) or LaTeX (one tabular per task)."""
    if form == "csv":
        fields = list(dict.fromkeys(key for row in summary for key in row)) or ["task"]
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n", restval="")
        writer.writeheader()
        writer.writerows(summary)
        return buffer.getvalue()
    lines = []
    for task in sorted({row["task"] for row in summary}):
        header, body, notes = task_table([row for row in summary if row["task"] == task], settings[task])
        lines += latex_table(task, header, body, notes) if form == "latex" else markdown_table(task, header, body, notes)
    if form == "latex":
        return "\n".join(lines) + "\n"
    bad = [run for run in runs if run["status"] != "completed"]
    if bad:
        lines += ["", f"{len(bad)} run(s) not completed:"]
        lines += [f"- {run['status']}: {run['task']} / {run['attention']} / seed {run['seed']} in {run['path']}: "
                  f"{str(run.get('error') or '').splitlines()[0] if run.get('error') else ''}" for run in bad]
    used = sorted({s["published_table"] for s in summary if s["published_table"]})
    if used:
        lines += ["", "Published numbers (lra/analysis/published.yaml):"] + [f"- {name}: {tables[name]['source']}" for name in used]
    return "\n".join(lines) + "\n"


def markdown_table(task: str, header: list[str], body: list[list[str]], notes: list[str]) -> list[str]:
    lines = [f"### {task}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return lines + ([""] + [f"{note}." if not note.endswith(".") else note for note in notes] if notes else []) + [""]


def latex_table(task: str, header: list[str], body: list[list[str]], notes: list[str]) -> list[str]:
    escape = lambda text: (text.replace("_", r"\_").replace("%", r"\%").replace("±", r"$\pm$")
                           .replace("Δ", r"$\Delta$"))
    lines = [f"% {task}" + "".join(f"; {note}" for note in notes),
             r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}", r"\toprule",
             " & ".join(map(escape, header)) + r" \\", r"\midrule"]
    lines += [" & ".join(map(escape, cells)) + r" \\" for cells in body]
    return lines + [r"\bottomrule", r"\end{tabular}", ""]
