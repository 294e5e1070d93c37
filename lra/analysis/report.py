"""The paper tables: ``python -m lra.analysis.report <run or sweep dir(s)> [--format md|csv|latex] [--out FILE]
[--baseline ROW] [--plot FILE] [--curves FILE]`` (``lra-report`` runs this too).

Collects every run under the given directories (``results.json``; a Hydra job dir with
``.hydra/config.yaml`` but no ``results.json`` is a run that died or is still running: "missing";
a sweep records jobs it has not reached as "not_started", counted as missing too),
optionally the runs of a W&B group (``--wandb ENTITY/PROJECT --group NAME``, needs network), and
groups them per task by (attention name, the overrides whose values differ between that task's runs,
seed excluded). One table per task (:mod:`lra.analysis.report_tables`), each row: runs completed /
failed / interrupted / missing (columns shown only when a run is not completed), test accuracy mean ±
sample std (ddof 1) over completed seeds, the independent test (ListOps) and what the task's shortcut
scores on the same splits (ListOps: the first-operator cue, :mod:`lra.analysis.listops_cue`), the
published number of ``lra/analysis/published.yaml`` and our mean minus it (on the independent test where
the runs have it), McNemar's exact p against the task's baseline row on the same examples
(:mod:`lra.analysis.significance`; ``predictions.json`` of both runs), best validation, steps, wall time,
throughput, peak memory. Failed and missing runs are listed under the tables, never dropped.
``--curves`` draws every run's validation accuracy against the step with chance, the shortcut and the
published numbers as reference lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lra import REPO_ROOT  # importing lra registers the ${repo_root:} resolver used by run configs
from lra.analysis import listops_cue
from lra.analysis.comparability import PUBLISHED, lookup, published_for
from lra.analysis.report_tables import render
from lra.analysis.significance import compare_runs, read_predictions
from lra.tasks.listops import INDEPENDENT_TEST

ALWAYS_SPLIT = ("task", "attention")          # part of every group key already
NEVER_SPLIT = ("seed", "group", "tags")       # vary inside a group by design
LOCATION_PREFIXES = ("paths.",)               # where files live (caches, logs), not what is trained
# task -> (what its shortcut is, what it scores per split of a data dir)
SHORTCUTS = {"listops": ("the first-operator cue fitted on train, lra.analysis.listops_cue", listops_cue.split_accuracies)}
PAIRED_SPLITS = (INDEPENDENT_TEST, "test")      # the paired test uses the first both runs have predictions for
_shortcut_cache: dict[str, dict[str, float]] = {}


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

    def label(self) -> str:
        """``attention`` and the settings that tell this row apart, e.g. ``curformer attention.selection=sum``."""
        return " ".join([self.attention, *(f"{key}={value}" for key, value in self.settings.items() if value != "-")])


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


def setting_value(key: str, value: str) -> str:
    """An override's value as the table compares it: ``task.data_dir`` relative to the checkout made absolute,
    so ``data/x`` and ``<repo>/data/x`` are one dataset."""
    if key == "task.data_dir" and not Path(value).is_absolute() and "$" not in value:
        return str((REPO_ROOT / value).resolve())
    return value


def parse_overrides(overrides: list[str]) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in overrides if "=" in item)
    return {key.lstrip("+~"): setting_value(key.lstrip("+~"), value) for key, value in pairs}


def group_runs(runs: list[dict]) -> tuple[list[Row], dict[str, list[str]]]:
    """Rows keyed by (task, attention, values of the overrides that differ across the task's runs), and for each
    task those keys (its table's setting columns)."""
    parsed = [parse_overrides(run["overrides"]) for run in runs]
    settings: dict[str, list[str]] = {}
    for task in sorted({str(run["task"]) for run in runs}):
        of_task = [overrides for run, overrides in zip(runs, parsed) if str(run["task"]) == task]
        keys = sorted({key for overrides in of_task for key in overrides if not key.startswith(LOCATION_PREFIXES)}
                      - set(ALWAYS_SPLIT) - set(NEVER_SPLIT))
        settings[task] = [key for key in keys if len({overrides.get(key) for overrides in of_task}) > 1]
    rows: dict[tuple, Row] = {}
    for run, overrides in zip(runs, parsed):
        chosen = {key: overrides.get(key, "-") for key in settings[str(run["task"])]}
        key = (str(run["task"]), str(run["attention"]), tuple(chosen.values()))
        rows.setdefault(key, Row(str(run["task"]), str(run["attention"]), chosen)).runs.append(run)
    return [rows[key] for key in sorted(rows)], settings


def percent_stats(row: Row, key: str) -> tuple[float | None, float | None]:
    """Mean and sample std (ddof 1; None below two runs) of ``key`` over the row's completed runs, in %."""
    values = [100 * value for value in row.values(key)]
    return (statistics.fmean(values) if values else None), (statistics.stdev(values) if len(values) > 1 else None)


def shortcut_scores(row: Row) -> dict[str, float]:
    """What the task's shortcut alone scores per split of the row's data (ListOps: the first-operator cue), in %."""
    _, probe = SHORTCUTS.get(row.task, (None, None))
    data_dir = lookup(row.runs[0].get("config") or {}, "task.data_dir")
    if probe is None or data_dir is None or not Path(data_dir).is_dir():
        return {}
    if data_dir not in _shortcut_cache:
        _shortcut_cache[data_dir] = {split: 100 * acc for split, acc in probe(Path(data_dir)).items()}
    return _shortcut_cache[data_dir]


def paired_test(row: Row, baseline: Row | None) -> dict | None:
    """McNemar's exact test of ``row`` against ``baseline`` on the lowest seed both completed with predictions,
    on the independent test where both have it, else the test split."""
    if baseline is None or baseline is row:
        return None
    seeds = {run["seed"]: run for run in baseline.runs if run["status"] == "completed"}
    for run in sorted((run for run in row.runs if run["status"] == "completed"), key=lambda run: run["seed"]):
        if run["seed"] in seeds and (result := compare_runs(run["path"], seeds[run["seed"]]["path"], PAIRED_SPLITS)):
            split, test = result
            return {"p": test.p, "seed": run["seed"], "split": split, "b": test.b, "c": test.c}
    return None


def choose_baseline(rows: list[Row], wanted: str | None) -> Row | None:
    """The row every other row of a task is tested against: ``wanted`` (a row label or attention name), else
    ``softmax``, else the first row with saved predictions."""
    with_predictions = [row for row in rows if any(read_predictions(run["path"]) for run in row.runs
                                                   if run["status"] == "completed" and Path(run["path"]).is_dir())]
    for name in (wanted, "softmax"):
        chosen = [row for row in with_predictions if name in (row.label(), row.attention)]
        if chosen:
            return chosen[0]
    return with_predictions[0] if with_predictions else None


def summarize(rows: list[Row], tables: dict, baseline: str | None = None) -> list[dict]:
    """One flat dict per row: counts, accuracies (mean, std in %), shortcut, published number and difference,
    paired test against the task's baseline row."""
    baselines = {task: choose_baseline([row for row in rows if row.task == task], baseline)
                 for task in {row.task for row in rows}}
    out = []
    for row in rows:
        test_mean, test_std = percent_stats(row, "test_acc")
        independent_mean, independent_std = percent_stats(row, "independent_test_acc")
        speed, memory = row.values("samples_per_s"), row.values("peak_mem_bytes")
        steps, seconds = row.values("steps"), row.values("train_time_s")
        published = published_for(row, tables)
        compared = independent_mean if independent_mean is not None else test_mean
        cue = shortcut_scores(row)
        paired = paired_test(row, baselines[row.task])
        out.append({
            "task": row.task, "attention": row.attention, **row.settings, "label": row.label(),
            "seeds": len(row.values("test_acc")), "failed": row.status_count("failed"),
            "interrupted": row.status_count("interrupted"), "missing": row.status_count("missing", "not_started"),
            "test_acc_mean": test_mean, "test_acc_std": test_std,
            "independent_test_acc_mean": independent_mean, "independent_test_acc_std": independent_std,
            "cue_test": cue.get("test"), "cue_independent_test": cue.get(INDEPENDENT_TEST),
            "shortcut": SHORTCUTS[row.task][0] if cue else None,
            "val_acc_best_mean": percent_stats(row, "val_acc_best")[0],
            "steps": round(statistics.fmean(steps)) if steps else None,
            "train_time_min": statistics.fmean(seconds) / 60 if seconds else None,
            "samples_per_s": statistics.fmean(speed) if speed else None,
            "peak_mem_mib": statistics.fmean(memory) / 2**20 if memory else None,
            "published": published["acc"] if published else None,
            "published_table": published["table"] if published else None,
            "published_note": published["note"] if published and published["acc"] is None else None,
            "delta": compared - published["acc"] if published and published["acc"] is not None and compared is not None else None,
            "baseline": baselines[row.task].label() if baselines[row.task] else None,
            "p_value": paired["p"] if paired else None,
            "paired_on": f"{paired['split']}, seed {paired['seed']}" if paired else None,
        })
    return out


def reference_lines(rows: list[Row], summary: list[dict]) -> dict[str, dict[str, float]]:
    """Per task, the levels a validation curve is read against: chance, the shortcut on the validation split, and
    each distinct published number (labelled by its row)."""
    lines: dict[str, dict[str, float]] = {}
    for row, summarized in zip(rows, summary):
        task = lines.setdefault(row.task, {})
        classes = lookup(row.runs[0].get("config") or {}, "task.num_classes")
        if classes:
            task["chance"] = 100 / classes
        if (cue := shortcut_scores(row).get("val")) is not None:
            task["shortcut (val)"] = cue
        if summarized["published"] is not None:
            task[f"published {row.label()}"] = summarized["published"]
    return lines


def wandb_runs(path: str, group: str | None) -> list[dict]:
    """Runs of W&B project ``ENTITY/PROJECT`` (one ``group`` if given) as report records (needs network + login)."""
    import wandb

    try:
        api_runs = list(wandb.Api().runs(path, filters={"group": group} if group else {}))
    except Exception as error:
        raise RuntimeError(f"could not read W&B runs of {path}: {error}. --wandb needs network access and `wandb login`;"
                           f" offline runs must be uploaded first: wandb sync <run dir>/wandb/offline-run-*") from error
    states = {"finished": "completed", "running": "missing"}
    records = []
    for run in api_runs:
        summary = run.summary  # results.json's scalars under lra.wandb_summary's names
        config = dict(run.config.get("config") or run.config)  # runs logged before lra.wandb_summary: at the top
        records.append({
            "task": lookup(config, "task.name"), "attention": lookup(config, "attention.name"), "seed": config.get("seed"),
            "status": summary.get("status") or states.get(run.state, "failed"),
            "error": summary.get("error") or f"W&B state {run.state}",
            "test_acc": summary.get("test/acc"), "val_acc_best": summary.get("val/acc_best"),
            "independent_test_acc": summary.get(f"{INDEPENDENT_TEST}/acc"), "steps": summary.get("steps"),
            "train_time_s": summary.get("train_time_s"), "samples_per_s": summary.get("perf/samples_per_s"),
            "peak_mem_bytes": summary.get("perf/peak_mem_bytes"), "overrides": list(run.config.get("overrides") or []),
            "tags": list(run.tags), "config": config, "path": run.url,
        })
    return records


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
    parser.add_argument("--baseline", help="the row each task's paired test compares against, by label (e.g. "
                        "'curformer attention.selection=abs') or attention name (default: softmax, else the first row "
                        "with predictions)")
    args = parser.parse_args(argv)
    if not args.dirs and not args.wandb:
        parser.error("give at least one sweep dir (e.g. outputs/multirun/<date>) or --wandb ENTITY/PROJECT")
    runs = collect(args.dirs) + (wandb_runs(args.wandb, args.group) if args.wandb else [])
    if not runs:
        print(f"no runs (results.json or .hydra job dirs) under {', '.join(map(str, args.dirs))}", file=sys.stderr)
        return 1
    tables = yaml.safe_load(args.published.read_text())
    rows, settings = group_runs(runs)
    if args.baseline and not any(args.baseline in (row.label(), row.attention) for row in rows):
        parser.error(f"--baseline {args.baseline!r} names no row; the rows are: "
                     + "; ".join(sorted({row.label() for row in rows})))
    summary = summarize(rows, tables, args.baseline)
    text = render(summary, settings, runs, tables, args.format)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    if args.plot:
        from lra.analysis.report_plot import plot_accuracy_vs_throughput

        plot_accuracy_vs_throughput(summary, args.plot)
    if args.curves:
        from lra.analysis.report_plot import plot_learning_curves

        by_run = {id(run): row.settings for row in rows for run in row.runs}
        plot_learning_curves(runs, args.curves, [by_run[id(run)] for run in runs], reference_lines(rows, summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
