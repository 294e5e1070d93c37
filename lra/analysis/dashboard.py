"""The W&B dashboard: ``python -m lra.analysis.dashboard ENTITY/PROJECT [--group NAME] [--tasks T ...] [--runs DIR ...]
[--dry-run]`` (``python -m lra.analysis.dashboard`` too) saves, with ``wandb-workspaces``, per task a saved
workspace view and one report holding every task's table.

A view per task (W&B panels have no run filter of their own: a view's runs are the task's runs of the group),
its runs grouped by ``attention``, with four sections: *Learning curves* (``val/acc`` and ``train/loss``
against the training step, mean ± std over seeds), *Test accuracy* (``test/acc`` per attention, ListOps also
``independent_test/acc``), *Speed vs accuracy* (``test/acc`` against ``perf/samples_per_s``, one point per
run: the papers' speed/accuracy figure), *Peak memory* (``perf/peak_mem_bytes`` per attention). The report
has a section per task: its runs table grouped by attention with the record's columns (test accuracy, best
validation, samples/s, peak memory, steps, time, status, commit), the test-accuracy and speed panels, and
the published numbers beside them from ``lra/analysis/published.yaml``, matched to our rows by
:func:`lra.analysis.comparability.published_for` as in ``lra.analysis.report``.

Every key comes from :mod:`lra.runtime.wandb_summary` (the run config's flat keys and the summary of ``results.json``)
or from what training logs (``val/acc``, ``train/loss``, ``trainer/global_step``); ``tests/analysis/test_dashboard.py``
checks them against a real offline run. ``--dry-run`` prints the spec as JSON and needs no network; otherwise
the runs of the group are read from W&B (network and ``wandb login``; offline runs must be synced first),
which also gives the tasks and the rows the published numbers are matched to. ``--runs`` reads them from
local run or sweep dirs instead (those ``wandb sync`` uploads).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from lra.analysis.comparability import PUBLISHED, published_for
from lra.analysis.report import Row, collect, group_runs, wandb_runs
from lra.config import CONFIG_DIR
from lra.tasks.listops_vocab import INDEPENDENT_TEST

STEP = "trainer/global_step"  # the x axis Lightning's WandbLogger logs every metric against
GROUP_BY = "attention"        # flat config key (lra.runtime.wandb_summary.GROUP_KEYS)
CONFIG_COLUMNS = ("attention", "seed", "num_landmarks", "selection", "positions")
SUMMARY_COLUMNS = ("val/acc_best", "perf/samples_per_s", "perf/peak_mem_bytes", "perf/peak_mem_measure",
                   "steps", "train_time_s", "status", "git_commit")


def line(y: str) -> dict:
    """``y`` against the training step, one line per attention (mean over seeds, ± std band)."""
    return {"type": "line", "title": f"{y} (mean ± std over seeds)", "x": STEP, "y": y, "groupby": GROUP_BY}


def bar(y: str, note: str = "") -> dict:
    """``y`` of the runs' summaries, one bar per attention (mean over seeds, ± std)."""
    return {"type": "bar", "title": f"{y} per attention{note}", "y": y, "groupby": GROUP_BY}


def accuracy_keys(task: str) -> list[str]:
    """The test accuracies a task's runs log: ListOps also on its independent test (where the data has one)."""
    return ["test/acc", f"{INDEPENDENT_TEST}/acc"] if task == "listops" else ["test/acc"]


def accuracy_panels(task: str) -> list[dict]:
    """Test accuracy per attention, and test/acc against throughput (the papers' speed/accuracy figure)."""
    return [*map(bar, accuracy_keys(task)), {"type": "scatter", "title": "test/acc vs training samples/s (one point per run)",
                                            "x": "perf/samples_per_s", "y": "test/acc"}]


def workspace_sections(task: str) -> list[dict]:
    *accuracy, speed = accuracy_panels(task)
    return [
        {"name": "Learning curves", "panels": [line("val/acc"), line("train/loss")]},
        {"name": "Test accuracy", "panels": accuracy},
        {"name": "Speed vs accuracy", "panels": [speed]},
        {"name": "Peak memory", "panels": [bar("perf/peak_mem_bytes", " (perf/peak_mem_measure says which memory)")]},
    ]


def run_filters(task: str, group: str | None) -> dict:
    """The runs a task's view or report section shows: ``{"config": {key: value}, "run": {attribute: value}}``."""
    return {"config": {"task": task}, **({"run": {"group": group}} if group else {})}


def published_rows(task: str, rows: list[Row], tables: dict) -> list[dict]:
    """The published numbers beside a task's table: per row of our runs, the entry ``published_for`` matches (as
    ``lra.analysis.report`` does); with no runs known, every entry of ``published.yaml`` for the task."""
    ours = [row for row in rows if row.task == task]
    if ours:
        return [{"row": row.label(), "runs": len(row.runs),
                 **(published_for(row, tables) or {"acc": None, "std": None, "table": None, "source": None,
                                                   "note": "no published row"})} for row in ours]
    entries = []
    for name, table in tables.items():
        if task in table["tasks"]:
            column = table["tasks"].index(task)
            entries += [{"row": " ".join([entry["attention"], *(f"{k}={v}" for k, v in (entry.get("match") or {}).items())]),
                         "runs": None, "acc": entry["acc"][column],
                         "std": entry["std"][column] if entry.get("std") else None, "table": name,
                         "source": table["source"],
                         "note": f"not comparable: {entry['incomparable']}" if entry.get("incomparable")
                         else entry.get("note", "")} for entry in table["rows"]]
    return entries


def build_spec(entity: str, project: str, group: str | None, tasks: list[str], rows: list[Row], tables: dict) -> dict:
    """The dashboard as plain data: ``workspaces`` (one per task) and the ``report``."""
    where = f"group {group}" if group else "all runs"
    return {
        "entity": entity, "project": project, "group": group,
        "workspaces": [{"name": f"{where}: {task}", "filters": run_filters(task, group), "groupby": GROUP_BY,
                        "sections": workspace_sections(task)} for task in tasks],
        "report": {
            "title": f"LRA: {where}",
            "description": "Test accuracy per attention (grouped runs: mean over seeds) beside the published numbers "
                           "(lra/analysis/published.yaml, matched as lra.analysis.report does).",
            "sections": [{
                "task": task, "filters": run_filters(task, group), "groupby": GROUP_BY,
                "columns": {"config": list(CONFIG_COLUMNS), "summary": accuracy_keys(task) + list(SUMMARY_COLUMNS)},
                "panels": accuracy_panels(task),
                "published": published_rows(task, rows, tables),
            } for task in tasks],
        },
    }


def used_keys(spec: dict) -> dict[str, set[str]]:
    """Every key the spec reads: ``{"summary": metric keys, "config": run config keys, "run": run attributes}``."""
    keys: dict[str, set[str]] = {"summary": set(), "config": set(), "run": set()}
    for part in [*spec["workspaces"], *spec["report"]["sections"]]:
        for section, filters in part["filters"].items():
            keys[section] |= set(filters)
        keys["config"].add(part["groupby"])
        for section, columns in part.get("columns", {}).items():
            keys[section] |= set(columns)
        panels = part.get("panels") or [panel for section in part["sections"] for panel in section["panels"]]
        for panel in panels:
            keys["summary"] |= {panel["y"], *([panel["x"]] if "x" in panel else [])}
            keys["config"] |= {panel["groupby"]} if "groupby" in panel else set()
    return keys


def published_markdown(task: str, published: list[dict]) -> str:
    """The report's table of published numbers for a task (``published_rows``), their sources under it."""
    lines = [f"**Published ({task})**, from lra/analysis/published.yaml\n", "| row | runs | published % | table | note |",
             "|---|---|---|---|---|"]
    for entry in published:
        acc = "—" if entry["acc"] is None else f"{entry['acc']:.2f}" + (f" ± {entry['std']}" if entry["std"] else "")
        lines.append(f"| {entry['row']} | {entry['runs'] or ''} | {acc} | {entry['table'] or ''} | {entry['note']} |")
    sources = sorted({entry["source"] for entry in published if entry["source"]})
    return "\n".join(lines + ([""] + [f"- {source}" for source in sources] if sources else []))


def panel(spec: dict):
    """A ``wandb_workspaces`` panel from its spec; grouped panels show the mean with a ± std band."""
    import wandb_workspaces.reports.v2 as wr

    if spec["type"] == "scatter":
        return wr.ScatterPlot(title=spec["title"], x=wr.SummaryMetric(spec["x"]), y=wr.SummaryMetric(spec["y"]))
    grouped = {"groupby": wr.Config(spec["groupby"]), "groupby_aggfunc": "mean", "groupby_rangefunc": "stddev"}
    if spec["type"] == "line":
        return wr.LinePlot(title=spec["title"], x=spec["x"], y=[spec["y"]], **grouped)
    return wr.BarPlot(title=spec["title"], metrics=[spec["y"]], **grouped)


def filter_exprs(filters: dict) -> list:
    from wandb_workspaces import expr

    run_attributes = {"group": "Group"}  # wandb_workspaces' names of run attributes
    return ([expr.Config(key) == value for key, value in filters.get("config", {}).items()]
            + [expr.Metric(run_attributes[key]) == value for key, value in filters.get("run", {}).items()])


def build_views(spec: dict) -> list:
    """One ``wandb_workspaces.workspaces.Workspace`` (a saved view) per task; building needs no network."""
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    columns = [f"summary:{key}" for key in ("test/acc", "perf/samples_per_s", "perf/peak_mem_bytes", "status")]
    return [ws.Workspace(
        entity=spec["entity"], project=spec["project"], name=view["name"],
        sections=[ws.Section(name=section["name"], panels=[panel(p) for p in section["panels"]], is_open=True)
                  for section in view["sections"]],
        runset_settings=ws.RunsetSettings(filters=filter_exprs(view["filters"]), groupby=[expr.Config(view["groupby"])],
                                          pinned_columns=[f"config:{GROUP_BY}.value", *columns]),
    ) for view in spec["workspaces"]]


def build_report(spec: dict):
    """The ``wandb_workspaces.reports.v2.Report``: per task a heading, its runs table and panels, the published
    numbers; building needs no network (saving does)."""
    import wandb_workspaces.reports.v2 as wr

    report = spec["report"]
    blocks = [wr.P(report["description"])]
    for section in report["sections"]:
        columns = ([f"config:{key}.value" for key in section["columns"]["config"]]
                   + [f"summary:{key}" for key in section["columns"]["summary"]])
        runset = wr.Runset(entity=spec["entity"], project=spec["project"], name=section["task"],
                           filters=filter_exprs(section["filters"]), groupby=[f"config.{section['groupby']}"],
                           pinned_columns=columns, visible_columns=columns, lock_columns=True)
        blocks += [wr.H2(section["task"]), wr.PanelGrid(runsets=[runset], panels=[panel(p) for p in section["panels"]]),
                   wr.MarkdownBlock(published_markdown(section["task"], section["published"]))]
    return wr.Report(entity=spec["entity"], project=spec["project"], title=report["title"],
                     description=report["description"], blocks=blocks, width="fluid")


def without_wandb(dirs: list[Path]) -> list[Path]:
    """The run dirs under ``dirs`` (those holding a ``results.json``) with no W&B run folder in ``wandb/``."""
    return [path.parent for root in dirs for path in sorted(root.rglob("results.json"))
            if not any((path.parent / "wandb").glob("*run-*"))]


def config_tasks() -> list[str]:
    """Every task of ``configs/task/`` (the dry run's sections when no runs name them)."""
    return sorted(path.stem for path in (CONFIG_DIR / "task").glob("*.yaml"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lra.analysis.dashboard", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", metavar="ENTITY/PROJECT", help="the W&B project the runs were synced to")
    parser.add_argument("--group", help="W&B group (the sweep dir's name); default: every run of the project")
    parser.add_argument("--tasks", nargs="+", help="a section per task (default: the tasks of the runs; in a dry run "
                        "without runs, every configs/task/ config)")
    parser.add_argument("--runs", nargs="+", type=Path, metavar="DIR", help="read the runs from these run or sweep "
                        "dirs instead of W&B (for the tasks and the published rows)")
    parser.add_argument("--published", type=Path, default=PUBLISHED, help="published-numbers file (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the workspace and report spec; no network")
    args = parser.parse_args(argv)
    entity, _, project = args.path.partition("/")
    if not entity or not project or "/" in project:
        parser.error(f"expected ENTITY/PROJECT (e.g. my-team/lra-attention), got {args.path!r}")
    if missing := [str(path) for path in args.runs or [] if not path.is_dir()]:
        print(f"[lra] FAILED: --runs: not a directory: {', '.join(missing)}; give run or sweep dirs of lra.train "
              f"(e.g. outputs/runs, outputs/multirun/<date_time.µs>)", file=sys.stderr)
        return 1
    try:
        runs = collect(args.runs) if args.runs else [] if args.dry_run else wandb_runs(args.path, args.group)
    except Exception as error:  # no network, no login: one line (wandb_runs names the fix)
        print(f"[lra] FAILED: {' '.join(str(error).split())}; --dry-run --runs DIR builds the spec offline",
              file=sys.stderr)
        return 1
    if args.runs and (without := without_wandb(args.runs)):
        total = sum(1 for root in args.runs for _ in root.rglob("results.json"))
        print(f"[lra] note: {len(without)} of {total} runs under --runs have no W&B data (no <run dir>/wandb/: "
              f"logger=csv or none), e.g. {without[0]}: the dashboard shows W&B's records only, so they will not "
              f"appear in it; train with logger=wandb (the default), then wandb sync", file=sys.stderr)
    rows = group_runs(runs)[0] if runs else []
    tasks = args.tasks or sorted({row.task for row in rows}) or (config_tasks() if args.dry_run else [])
    if not tasks:
        print(f"no runs in {args.path}" + (f" group {args.group}" if args.group else "") + ": sync them first "
              "(wandb sync outputs/multirun/<sweep>/*/wandb/offline-run-*) or name --tasks", file=sys.stderr)
        return 1
    spec = build_spec(entity, project, args.group, tasks, rows, yaml.safe_load(args.published.read_text()))
    views, report = build_views(spec), build_report(spec)  # built (and so validated) in a dry run too
    if args.dry_run:
        print(json.dumps(spec, indent=2, ensure_ascii=False))
        return 0
    try:
        for view in views:
            view.save()
        report.save()
    except Exception as error:  # no network, no login: one line, not the traceback of W&B's client
        print(f"[lra] FAILED: saving the workspace views and report to W&B ({type(error).__name__}: "
              f"{' '.join(str(error).split())[:200]}): it needs network and `wandb login`; --dry-run prints them "
              f"without", file=sys.stderr)
        return 1
    print(f"[lra] saved {len(views)} workspace views ({', '.join(view.url for view in views)}) and the report {report.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
