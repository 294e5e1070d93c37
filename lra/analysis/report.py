"""The paper tables: ``python -m lra.analysis.report <run or sweep dir(s)> [--format markdown|latex|csv]
[--columns NAMES|all] [--out FILE] [--baseline ROW] [--plot FILE] [--curves FILE]`` (``lra-report`` runs this too).

Reads every run under the given directories (:mod:`lra.analysis.report_runs`; unreadable records are skipped
with a warning), optionally the runs of a W&B group (``--wandb ENTITY/PROJECT --group NAME``, needs network),
and prints per task one table (:mod:`lra.analysis.report_tables`), one row per attention and setting
(:mod:`lra.analysis.report_settings`: what the row changes from the task's plain recipe), its seeds the
distinct seeds of its completed runs (:mod:`lra.analysis.report_rows`). A row holds test accuracy mean ± sample
std (ddof 1), the independent test (ListOps), the task's shortcut on the same splits (ListOps: the
first-operator cue), the published number of ``lra/analysis/published.yaml`` and our mean minus it (or why the
number is not comparable), McNemar's exact p against the task's baseline row on the same examples, throughput
and peak memory (:mod:`lra.analysis.report_summary`). Failed and missing runs are counted in ``seeds`` and
listed under the tables, never dropped. ``--plot`` and ``--curves`` draw the figures of
:mod:`lra.analysis.report_plot` (PNG and PDF).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from lra import REPO_ROOT
from lra.analysis.comparability import PUBLISHED
from lra.analysis.report_rows import Row, group_runs
from lra.analysis.report_runs import collect, wandb_runs
from lra.analysis.report_summary import summarize
from lra.analysis.report_tables import DEFAULT, EXTRA, chosen_columns, render

__all__ = ["Row", "collect", "group_runs", "main", "summarize", "wandb_runs"]
FORMATS = {"markdown": "markdown", "md": "markdown", "latex": "latex", "csv": "csv"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lra.analysis.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="sweep or run directories (searched recursively)")
    parser.add_argument("--format", choices=tuple(FORMATS), default="markdown", help="markdown (md), latex "
                        "(booktabs tabular per task) or csv (the same columns, raw numbers)")
    parser.add_argument("--columns", help=f"more columns, comma-separated: {', '.join(EXTRA)}, or all "
                        f"(default: {', '.join(DEFAULT)})")
    parser.add_argument("--out", type=Path, help="write the table here instead of stdout")
    parser.add_argument("--plot", type=Path, help="also draw accuracy vs throughput, marker area = peak memory "
                        "(FILE.png and FILE.pdf)")
    parser.add_argument("--curves", type=Path, help="also draw each run's validation accuracy vs step "
                        "(FILE.png and FILE.pdf)")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="also read the runs of this W&B project (online)")
    parser.add_argument("--group", help="W&B group (the sweep name) to read with --wandb")
    parser.add_argument("--published", type=Path, default=PUBLISHED, help="published-numbers file (default: %(default)s)")
    parser.add_argument("--baseline", help="the row each task's paired test compares against, by label (attention "
                        "and setting as the table shows them, e.g. 'curformer selection=sum') or attention name "
                        "(its plain-recipe row); default: the plain-recipe softmax row, else the plain-recipe "
                        "curformer row, else the first plain-recipe row, never one at chance")
    args = parser.parse_args(argv)
    if not args.dirs and not args.wandb:
        parser.error("give at least one sweep dir (e.g. outputs/multirun/<date>) or --wandb ENTITY/PROJECT")
    try:
        args.columns = chosen_columns(args.columns)
    except ValueError as error:
        parser.error(str(error))
    args.error = parser.error
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [path for path in args.dirs if not path.is_dir()]
    if missing:
        checkout = [REPO_ROOT / path for path in missing if not path.is_absolute() and (REPO_ROOT / path).is_dir()]
        hint = (f"; relative to {Path.cwd()}: the checkout's is {', '.join(map(str, checkout))}, give that" if checkout
                else "; give run or sweep dirs (e.g. outputs/runs, outputs/multirun/<date_time.µs>, or docs/runs)")
        print(f"[lra] FAILED: not a directory: {', '.join(map(str, missing))}{hint}", file=sys.stderr)
        return 1
    try:
        online = wandb_runs(args.wandb, args.group) if args.wandb else []
    except Exception as error:  # no login, no network: one line (wandb_runs names the fix), not a traceback
        print(f"[lra] FAILED: --wandb {args.wandb}: {' '.join(str(error).split()) or type(error).__name__}",
              file=sys.stderr)
        return 1
    runs = collect(args.dirs) + online
    if not runs:
        print(f"[lra] FAILED: no readable runs (results.json or .hydra job dirs) under "
              f"{', '.join(map(str, args.dirs))}; give the dir of a run or sweep of lra.train (e.g. outputs/runs, "
              f"outputs/multirun/<date_time.µs>)", file=sys.stderr)
        return 1
    tables = yaml.safe_load(args.published.read_text())
    rows, common = group_runs(runs)
    if args.baseline and not any(args.baseline in (row.label(), row.attention) for row in rows):
        args.error(f"--baseline {args.baseline!r} names no row; the rows are: "
                   + "; ".join(sorted({row.label() for row in rows})))
    summary = summarize(rows, tables, args.baseline)
    shared = {task: " · ".join(part.text for part in parts) for task, parts in common.items()}
    text = render(summary, shared, runs, tables, FORMATS[args.format], args.columns)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    if args.plot or args.curves:
        from lra.analysis.report_plot import plot_accuracy_vs_throughput, plot_learning_curves

        if args.plot:
            plot_accuracy_vs_throughput(summary, args.plot)
        if args.curves:
            plot_learning_curves(rows, summary, args.curves)
    return 0


if __name__ == "__main__":
    sys.exit(main())
