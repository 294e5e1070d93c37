"""Sweep report: ``python -m lra.analysis.report <sweep dir(s)> [--format md|csv|latex] [--out FILE] [--plot FILE] [--curves FILE]``.

Collects every run under the given directories (``results.json``; a Hydra job dir with
``.hydra/config.yaml`` but no ``results.json`` is a run that died or is still running: "missing";
a sweep records jobs it has not reached as "not_started", counted as missing too),
optionally the runs of a W&B group (``--wandb ENTITY/PROJECT --group NAME``, needs network), and
groups them by (task, attention name, the overrides whose values differ between the runs, seed
excluded). Each row: runs completed / failed / interrupted (SIGTERM) / missing, test accuracy mean ± sample std (ddof 1)
over completed seeds, best-validation mean, steps, training wall time, throughput, peak memory, the published number of
``lra/analysis/published.yaml`` with its source table, and our mean minus it. Failed and missing runs are
counted in their row and listed under the table, never dropped. ``--curves`` draws every run's
validation accuracy against the step (``val_curve`` of ``results.json``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

import lra  # noqa: F401  (registers the ${repo_root:} resolver used by run configs)
from lra.analysis.comparability import comparability, lookup

PUBLISHED = Path(__file__).with_name("published.yaml")
ALWAYS_SPLIT = ("task", "attention")          # part of every group key already
NEVER_SPLIT = ("seed", "group", "tags")       # vary inside a group by design
LOCATION_PREFIXES = ("paths.",)               # where files live (caches, logs), not what is trained


@dataclass
class Row:
    task: str
    attention: str
    settings: dict[str, str]
    runs: list[dict] = field(default_factory=list)

    def status_count(self, *statuses: str) -> int:
        return sum(run["status"] in statuses for run in self.runs)

    def values(self, key: str) -> list[float]:
        return [run[key] for run in self.runs if run["status"] == "completed" and run.get(key) is not None]


def load_run(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error}); the run was probably killed while writing it: "
                         "delete the file and re-run the job (it resumes from its last checkpoint)") from error
    record["path"] = str(path.parent)
    record.setdefault("overrides", [])
    record["tags"] = list((record.get("config") or {}).get("tags") or [])
    return record


def load_missing(job_dir: Path) -> dict:
    """A Hydra job dir without ``results.json``: killed, crashed hard, or still running."""
    config = yaml.safe_load((job_dir / ".hydra" / "config.yaml").read_text())
    overrides_file = job_dir / ".hydra" / "overrides.yaml"
    return {
        "task": lookup(config, "task.name"), "attention": lookup(config, "attention.name"), "seed": config.get("seed"),
        "status": "missing", "error": "no results.json (killed, crashed or still running)", "path": str(job_dir),
        "overrides": yaml.safe_load(overrides_file.read_text()) if overrides_file.exists() else [],
        "tags": list(config.get("tags") or []), "config": config,
    }


def collect(dirs: list[Path]) -> list[dict]:
    """Every run under ``dirs``: one record per ``results.json`` plus one per job dir that has none."""
    runs = []
    for root in dirs:
        if not root.is_dir():
            raise FileNotFoundError(f"sweep dir not found: {root} (pass a multirun dir, e.g. outputs/multirun/<date>)")
        runs += [load_run(path) for path in sorted(root.rglob("results.json"))]
        runs += [load_missing(cfg.parent.parent) for cfg in sorted(root.rglob(".hydra/config.yaml"))
                 if not (cfg.parent.parent / "results.json").exists()]
    return runs


def parse_overrides(overrides: list[str]) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in overrides if "=" in item)
    return {key.lstrip("+~"): value for key, value in pairs}


def group_runs(runs: list[dict]) -> tuple[list[Row], list[str]]:
    """Rows keyed by (task, attention, values of the overrides that differ across runs); and those keys."""
    parsed = [parse_overrides(run["overrides"]) for run in runs]
    keys = sorted({key for overrides in parsed for key in overrides if not key.startswith(LOCATION_PREFIXES)}
                  - set(ALWAYS_SPLIT) - set(NEVER_SPLIT))
    differing = [key for key in keys if len({overrides.get(key) for overrides in parsed}) > 1]
    rows: dict[tuple, Row] = {}
    for run, overrides in zip(runs, parsed):
        settings = {key: overrides.get(key, "-") for key in differing}
        key = (str(run["task"]), str(run["attention"]), tuple(settings.values()))
        rows.setdefault(key, Row(str(run["task"]), str(run["attention"]), settings)).runs.append(run)
    return [rows[key] for key in sorted(rows)], differing


def published_for(row: Row, tables: dict) -> dict | None:
    """The published row for ``row``: tables named in the runs' tags first, then file order; a row's
    ``match`` settings must hold in the runs' config, and its source's settings must be the run's
    (:func:`lra.analysis.comparability.comparability`). With no comparable row, the first matching one comes
    back with ``acc`` None and the reason in ``note``."""
    tags = {tag for run in row.runs for tag in run.get("tags", [])}
    config = row.runs[0].get("config") or {}
    ordered = sorted(tables.items(), key=lambda item: item[0] not in tags)
    refused = None
    for name, table in ordered:
        if row.task not in table["tasks"]:
            continue
        column = table["tasks"].index(row.task)
        for entry in table["rows"]:
            matches = all(lookup(config, key) == value for key, value in (entry.get("match") or {}).items())
            if entry["attention"] != row.attention or not matches:
                continue
            reason = comparability(config, entry)
            if reason:
                refused = refused or {"acc": None, "std": None, "table": name, "source": table["source"], "note": reason}
                continue
            std = entry.get("std")
            return {"acc": entry["acc"][column], "std": std[column] if std else None, "table": name,
                    "source": table["source"], "note": entry.get("note", "")}
    return refused


def summarize(rows: list[Row], tables: dict) -> list[dict]:
    """One flat dict per row: counts, mean ± std in %, published number and difference."""
    out = []
    for row in rows:
        acc = [100 * value for value in row.values("test_acc")]
        val = [100 * value for value in row.values("val_acc_best")]
        speed, memory = row.values("samples_per_s"), row.values("peak_mem_bytes")
        steps, seconds = row.values("steps"), row.values("train_time_s")
        published = published_for(row, tables)
        mean = statistics.fmean(acc) if acc else None
        out.append({
            "task": row.task, "attention": row.attention, **row.settings,
            "seeds": len(acc), "failed": row.status_count("failed"),
            "interrupted": row.status_count("interrupted"), "missing": row.status_count("missing", "not_started"),
            "test_acc_mean": mean, "test_acc_std": statistics.stdev(acc) if len(acc) > 1 else None,
            "val_acc_best_mean": statistics.fmean(val) if val else None,
            "steps": round(statistics.fmean(steps)) if steps else None,
            "train_time_min": statistics.fmean(seconds) / 60 if seconds else None,
            "samples_per_s": statistics.fmean(speed) if speed else None,
            "peak_mem_mib": statistics.fmean(memory) / 2**20 if memory else None,
            "published": published["acc"] if published else None,
            "published_table": published["table"] if published else None,
            "published_note": published["note"] if published and published["acc"] is None else None,
            "delta": mean - published["acc"] if published and published["acc"] is not None and mean is not None else None,
        })
    return out


def fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def display_rows(summary: list[dict], settings: list[str]) -> tuple[list[str], list[list[str]]]:
    header = ["task", "attention", *settings, "seeds", "failed", "interrupted", "missing", "test acc % (mean ± std)",
              "best val %", "steps", "train min", "samples/s", "peak MiB", "published %", "Δ", "source"]
    body = []
    for s in summary:
        acc = "-" if s["test_acc_mean"] is None else fmt(s["test_acc_mean"]) + (
            f" ± {fmt(s['test_acc_std'])}" if s["test_acc_std"] is not None else "")
        delta = "-" if s["delta"] is None else f"{s['delta']:+.2f}"
        body.append([s["task"], s["attention"], *(s[key] for key in settings), str(s["seeds"]), str(s["failed"]),
                     str(s["interrupted"]), str(s["missing"]), acc, fmt(s["val_acc_best_mean"]), fmt(s["steps"]),
                     fmt(s["train_time_min"], 0), fmt(s["samples_per_s"], 1),
                     fmt(s["peak_mem_mib"], 0), s["published_note"] or fmt(s["published"]), delta,
                     s["published_table"] or "-"])
    return header, body


def render(summary: list[dict], settings: list[str], runs: list[dict], tables: dict, form: str) -> str:
    """The table as markdown (with failed runs and sources listed below), CSV (raw numbers) or LaTeX."""
    if form == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(summary[0]) if summary else ["task"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(summary)
        return buffer.getvalue()
    header, body = display_rows(summary, settings)
    if form == "latex":
        escape = lambda text: text.replace("_", r"\_").replace("%", r"\%").replace("±", r"$\pm$").replace("Δ", r"$\Delta$")
        lines = [r"\begin{tabular}{" + "l" * (2 + len(settings)) + "r" * (len(header) - 2 - len(settings)) + "}",
                 r"\toprule", " & ".join(map(escape, header)) + r" \\", r"\midrule"]
        lines += [" & ".join(map(escape, cells)) + r" \\" for cells in body]
        return "\n".join(lines + [r"\bottomrule", r"\end{tabular}"]) + "\n"
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    bad = [run for run in runs if run["status"] != "completed"]
    if bad:
        lines += ["", f"{len(bad)} run(s) not completed:"]
        lines += [f"- {run['status']}: {run['task']} / {run['attention']} / seed {run['seed']} in {run['path']}: "
                  f"{str(run.get('error') or '').splitlines()[0] if run.get('error') else ''}" for run in bad]
    used = sorted({s["published_table"] for s in summary if s["published_table"]})
    if used:
        lines += ["", "Published numbers (lra/analysis/published.yaml):"] + [f"- {name}: {tables[name]['source']}" for name in used]
    return "\n".join(lines) + "\n"


def wandb_runs(path: str, group: str | None) -> list[dict]:
    """Runs of W&B project ``ENTITY/PROJECT`` (one ``group`` if given) as report records (needs network + login)."""
    import wandb

    try:
        api_runs = list(wandb.Api().runs(path, filters={"group": group} if group else {}))
    except Exception as error:
        raise RuntimeError(f"could not read W&B runs of {path}: {error}. --wandb needs network access and `wandb login`;"
                           f" offline runs must be uploaded first: wandb sync <run dir>/wandb/offline-run-*") from error
    states = {"finished": "completed", "running": "missing"}
    return [{
        "task": lookup(dict(run.config), "task.name"), "attention": lookup(dict(run.config), "attention.name"),
        "seed": run.config.get("seed"), "status": states.get(run.state, "failed"), "error": f"W&B state {run.state}",
        "test_acc": run.summary.get("test/acc"), "val_acc_best": run.summary.get("val/acc_best"),
        "samples_per_s": None, "peak_mem_bytes": None, "overrides": list(run.config.get("overrides") or []),
        "tags": list(run.tags), "config": dict(run.config), "path": run.url,
    } for run in api_runs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lra.analysis.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="sweep or run directories (searched recursively)")
    parser.add_argument("--format", choices=("md", "csv", "latex"), default="md")
    parser.add_argument("--out", type=Path, help="write the table here instead of stdout")
    parser.add_argument("--plot", type=Path, help="also draw accuracy vs throughput (marker size = memory) here")
    parser.add_argument("--curves", type=Path, help="also draw each run's validation accuracy vs step here")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="also read the runs of this W&B project (online)")
    parser.add_argument("--group", help="W&B group (the sweep name) to read with --wandb")
    parser.add_argument("--published", type=Path, default=PUBLISHED, help="published-numbers file (default: %(default)s)")
    args = parser.parse_args(argv)
    if not args.dirs and not args.wandb:
        parser.error("give at least one sweep dir (e.g. outputs/multirun/<date>) or --wandb ENTITY/PROJECT")
    runs = collect(args.dirs) + (wandb_runs(args.wandb, args.group) if args.wandb else [])
    if not runs:
        print(f"no runs (results.json or .hydra job dirs) under {', '.join(map(str, args.dirs))}", file=sys.stderr)
        return 1
    tables = yaml.safe_load(args.published.read_text())
    rows, settings = group_runs(runs)
    summary = summarize(rows, tables)
    text = render(summary, settings, runs, tables, args.format)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    if args.plot:
        from lra.analysis.report_plot import plot_accuracy_vs_throughput

        plot_accuracy_vs_throughput(summary, settings, args.plot)
    if args.curves:
        from lra.analysis.report_plot import plot_learning_curves

        by_run = {id(run): row.settings for row in rows for run in row.runs}
        plot_learning_curves(runs, args.curves, [by_run[id(run)] for run in runs])
    return 0


if __name__ == "__main__":
    sys.exit(main())
