"""Render :func:`lra.analysis.report_summary.summarize`'s rows: per task one table, as Markdown, LaTeX (booktabs)
or CSV, all three from the same columns.

A table has ``attention`` and ``setting`` (what the row changes from the task's plain recipe), then the
:data:`DEFAULT` columns (12 in all at most); ``--columns`` adds :data:`EXTRA` ones (``all``: every one). A
column no row of the task has a value for is left out of that task's table (not of the CSV). Rows come grouped
by attention, the plain recipe first. Under each table: what all its rows share, what the cue is, the paired
test's baseline and why it is that row, and why a published number is not comparable where it is not.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    name: str                      # what --columns calls it
    header: str
    cell: Callable[[dict], str]
    fields: tuple[str, ...]        # the summary keys behind it (the CSV's columns)
    needs: tuple[str, ...] = ()    # shown in a task's table when a row has one of these (default: fields[0])


def fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def mean_std(key: str) -> Callable[[dict], str]:
    def cell(row: dict) -> str:
        mean, std = row[f"{key}_mean"], row[f"{key}_std"]
        return "-" if mean is None else fmt(mean) + (f" ± {fmt(std)}" if std is not None else "")
    return cell


def seeds(row: dict) -> str:
    """Distinct completed seeds, and the runs that did not complete: ``2 (1 failed)``."""
    others = [f"{row[key]} {key}" for key in ("failed", "interrupted", "missing") if row[key]]
    return str(row["seeds"]) + (f" ({', '.join(others)})" if others else "")


def p_value(row: dict) -> str:
    if row["is_baseline"]:
        return "baseline"
    return "-" if row["p_value"] is None else f"{row['p_value']:.2g}" if row["p_value"] > 0 else "< 1e-300"


COLUMNS = {column.name: column for column in (
    Column("seeds", "seeds", seeds, ("seeds", "failed", "interrupted", "missing")),
    Column("test", "test %", mean_std("test_acc"), ("test_acc_mean", "test_acc_std")),
    Column("independent_test", "indep. test %", mean_std("independent_test_acc"),
           ("independent_test_acc_mean", "independent_test_acc_std")),
    Column("cue_test", "cue test %", lambda r: fmt(r["cue_test"]), ("cue_test",)),
    Column("cue_independent_test", "cue indep. %", lambda r: fmt(r["cue_independent_test"]), ("cue_independent_test",)),
    Column("published", "published %", lambda r: r["published_cell"], ("published", "published_note"),
           ("published", "published_note")),
    Column("delta", "Δ", lambda r: "-" if r["delta"] is None else f"{r['delta']:+.2f}", ("delta",)),
    Column("p", "p (McNemar)", p_value, ("p_value", "paired_on", "baseline")),
    Column("samples_per_s", "samples/s", lambda r: fmt(r["samples_per_s"], 1), ("samples_per_s",)),
    Column("peak_mib", "peak MiB", lambda r: fmt(r["peak_mem_mib"], 0), ("peak_mem_mib",)),
    Column("best_val", "best val %", lambda r: fmt(r["val_acc_best_mean"]), ("val_acc_best_mean",)),
    Column("steps", "steps", lambda r: fmt(r["steps"]), ("steps",)),
    Column("train_min", "train min", lambda r: fmt(r["train_time_min"], 0), ("train_time_min",)),
    Column("source", "source", lambda r: r["published_table"] or "-", ("published_table",)),
    Column("cue_val", "cue val %", lambda r: fmt(r["cue_val"]), ("cue_val",)),
)}
DEFAULT = ("seeds", "test", "independent_test", "cue_test", "cue_independent_test", "published", "delta", "p",
           "samples_per_s", "peak_mib")
EXTRA = tuple(name for name in COLUMNS if name not in DEFAULT)


def chosen_columns(extra: str | None) -> list[Column]:
    """:data:`DEFAULT` plus ``extra`` (comma-separated names, or ``all``); an unknown name raises ValueError."""
    names = list(EXTRA) if extra == "all" else [name.strip() for name in (extra or "").split(",") if name.strip()]
    unknown = [name for name in names if name not in COLUMNS]
    if unknown:
        raise ValueError(f"unknown column(s) {', '.join(unknown)}; --columns takes a comma-separated list of "
                         f"{', '.join(EXTRA)} (or all); shown by default: {', '.join(DEFAULT)}")
    return [COLUMNS[name] for name in (*DEFAULT, *(name for name in names if name not in DEFAULT))]


def has_value(column: Column, rows: list[dict]) -> bool:
    return column.name in ("seeds", "test") or any(row.get(key) not in (None, 0, "")
                                                  for row in rows for key in column.needs or column.fields[:1])


def mark_not_comparable(rows: list[dict]) -> list[str]:
    """Set each row's ``published_cell``; a number that is not comparable is ``n.c. (k)``, its reason a note."""
    reasons: dict[str, int] = {}
    for row in rows:
        if row["published_note"]:
            index = reasons.setdefault(row["published_note"], len(reasons) + 1)
            row["published_cell"] = f"n.c. ({index})"
        else:
            row["published_cell"] = fmt(row["published"])
    return [f"({index}) {reason}" for reason, index in reasons.items()]


def notes(rows: list[dict], common: str, task: str) -> list[str]:
    lines = [f"setting: what the row changes from the plain recipe (configs/task/{task}.yaml and the attention's "
             f"defaults); —: nothing" + (f"; all rows: {common}" if common else "")]
    if shortcut := next((row["shortcut"] for row in rows if row.get("shortcut")), None):
        lines.append(f"cue: {shortcut}, on the same split")
    baseline = rows[0]
    if any(row["p_value"] is not None for row in rows):
        on = sorted({row["paired_on"] for row in rows if row["paired_on"]})
        lines.append(f"p (McNemar): exact two-sided test on the same examples ({'; '.join(on)}) against "
                     f"`{baseline['baseline']}`, {baseline['baseline_reason']}")
    elif len(rows) > 1:
        lines.append(f"p (McNemar): none: {baseline['baseline_reason']}")
    if any(row["delta"] is not None and row["independent_test_acc_mean"] is not None for row in rows):
        lines.append("Δ: the independent-test mean (the test mean where a row has none) minus the published number")
    return lines + mark_not_comparable(rows)


def task_table(rows: list[dict], columns: list[Column], common: str) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, body (attention named on its group's first row only) and the notes of one task's table."""
    lines = notes(rows, common, rows[0]["task"])
    shown = [column for column in columns if has_value(column, rows)]
    body = [[row["attention"] if i == 0 or rows[i - 1]["attention"] != row["attention"] else "",
             row["setting"] or "—", *(column.cell(row) for column in shown)] for i, row in enumerate(rows)]
    return ["attention", "setting", *(column.header for column in shown)], body, lines


def render(summary: list[dict], common: dict[str, str], runs: list[dict], tables: dict, form: str,
           columns: list[Column]) -> str:
    """The tables as Markdown (runs not completed and the published sources below them), LaTeX (one booktabs
    tabular per task) or CSV (one row per report row, the columns' raw numbers)."""
    if form == "csv":
        for task in {row["task"] for row in summary}:
            mark_not_comparable([row for row in summary if row["task"] == task])
        fields = ["task", "attention", "setting", *(field for column in columns for field in column.fields)]
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(summary)
        return buffer.getvalue()
    lines = []
    for task in sorted({row["task"] for row in summary}):
        header, body, task_notes = task_table([row for row in summary if row["task"] == task], columns, common[task])
        lines += latex_table(task, header, body, task_notes) if form == "latex" else markdown_table(task, header, body, task_notes)
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
    return lines + [""] + [note if note.endswith(".") else f"{note}." for note in notes] + [""]


LATEX = {"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$", "{": r"\{",
         "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "Δ": r"$\Delta$",
         "·": r"$\cdot$", "—": "---", "<": r"$<$", ">": r"$>$"}


def latex_escape(text: str) -> str:
    return "".join(LATEX.get(char, char) for char in text)


def latex_table(task: str, header: list[str], body: list[list[str]], notes: list[str]) -> list[str]:
    """A booktabs ``tabular`` (``\\usepackage{booktabs}``), a ``\\midrule`` between attention groups; the notes
    as comments under it, for the caption."""
    lines = [f"% {task}", r"\begin{tabular}{ll" + "r" * (len(header) - 2) + "}", r"\toprule",
             " & ".join(map(latex_escape, header)) + r" \\", r"\midrule"]
    for i, cells in enumerate(body):
        if i and cells[0]:
            lines.append(r"\midrule")
        lines.append(" & ".join(map(latex_escape, cells)) + r" \\")
    return lines + [r"\bottomrule", r"\end{tabular}", *(f"% {note}" for note in notes), ""]
