"""One flat dict per report row: seeds, accuracies (mean ± sample std over seeds, in %), the task's shortcut on
the same splits, the published number and our difference, McNemar's exact p against the task's baseline row,
speed and memory.

The shortcut comes from the records (training writes ``shortcut_<split>_acc``); only for older records is it
computed from the run's data dir (:data:`SHORTCUT_FROM_DATA`), when that dir holds the data.

The paired test (:mod:`lra.analysis.significance`) compares two runs on the same examples only (the same data
dir, the same labels in ``predictions.json``), on the independent test where both have it, else the test
split. Its baseline row is ``--baseline`` when given, else the task's plain-recipe softmax row, else its
plain-recipe CURformer row, else its first plain-recipe row (in table order); a default baseline has runs with
predictions, none of them at chance (:func:`at_chance`), so the p-values say whether a variant differs from a
model that learned something.
"""

from __future__ import annotations

import functools
import statistics
from collections import Counter
from pathlib import Path

from lra.analysis import listops_cue
from lra.analysis.comparability import lookup, published_for
from lra.analysis.report_rows import Row
from lra.analysis.report_runs import warn
from lra.analysis.significance import compare_predictions, read_predictions
from lra.tasks.first_operator import FIRST_OPERATOR_CUE
from lra.tasks.listops_vocab import INDEPENDENT_TEST

PAIRED_SPLITS = (INDEPENDENT_TEST, "test")
SHORTCUT_SPLITS = ("val", "test", INDEPENDENT_TEST)
# task -> (what its shortcut is, its accuracy per split of a data dir): for records written before training
# recorded it
SHORTCUT_FROM_DATA = {"listops": (FIRST_OPERATOR_CUE, listops_cue.split_accuracies)}
CHANCE_MARGIN = 0.05  # a run within 5 points of always predicting the split's most frequent label is at chance
DEFAULT_BASELINES = ("softmax", "curformer")


def percent_stats(row: Row, key: str) -> tuple[float | None, float | None]:
    """Mean and sample std (ddof 1; None below two runs) of ``key`` over the row's completed runs, in %."""
    values = [100 * value for value in row.values(key)]
    return (statistics.fmean(values) if values else None), (statistics.stdev(values) if len(values) > 1 else None)


@functools.cache
def data_shortcut(task: str, data_dir: str) -> tuple[dict[str, float], str | None]:
    """The shortcut's accuracy (%) per split of ``data_dir`` and its name; nothing where the data is not there."""
    name, probe = SHORTCUT_FROM_DATA[task]
    if not (Path(data_dir) / "basic_train.tsv").is_file():
        return {}, None
    try:
        return {split: 100 * accuracy for split, accuracy in probe(Path(data_dir)).items()}, name
    except (OSError, ValueError) as error:
        warn(f"no {name} for the runs on {data_dir}: {error}")
        return {}, None


def shortcut_scores(row: Row) -> tuple[dict[str, float], str | None]:
    """What the task's shortcut alone scores per split (%), and what it is: as recorded by training, else
    computed from the data for older records."""
    recorded = {split: 100 * statistics.fmean(values) for split in SHORTCUT_SPLITS
                if (values := row.values(f"shortcut_{split}_acc"))}
    if recorded:
        return recorded, next(run.get("shortcut") for run in row.completed() if run.get("shortcut"))
    data_dir = next((lookup(run.get("config") or {}, "task.data_dir") for run in row.completed()), None)
    if row.task not in SHORTCUT_FROM_DATA or not isinstance(data_dir, str):
        return {}, None
    return data_shortcut(row.task, data_dir)


@functools.lru_cache(maxsize=64)
def cached_predictions(path: str) -> dict | None:
    try:
        return read_predictions(path) if Path(path).is_dir() else None
    except ValueError as error:
        warn(str(error))
        return None


def predictions(run: dict) -> dict | None:
    return cached_predictions(str(run["path"]))


def at_chance(run: dict) -> bool:
    """The run scores less than :data:`CHANCE_MARGIN` above always predicting the most frequent label, on the first
    paired split of its predictions (a model on the ListOps plateau: ~17-20 % against the majority's 17 %)."""
    saved = predictions(run) or {}
    split = next((split for split in PAIRED_SPLITS if split in saved), None)
    if split is None:
        return False
    labels, predicted = saved[split]["label"], saved[split]["pred"]
    accuracy = sum(p == y for p, y in zip(predicted, labels)) / len(labels)
    return accuracy < max(Counter(labels).values()) / len(labels) + CHANCE_MARGIN


def unusable(row: Row | None, name: str) -> str | None:
    """Why ``row`` cannot be a default baseline (None: it can)."""
    if row is None:
        return f"no plain-recipe {name} row"
    with_predictions = [run for run in row.completed() if predictions(run)]
    if not with_predictions:
        return f"the plain-recipe {name} row has no predictions.json"
    if any(at_chance(run) for run in with_predictions):
        return f"the plain-recipe {name} row has a run at chance"
    return None


def choose_baseline(rows: list[Row], wanted: str | None) -> tuple[Row | None, str]:
    """The row a task's other rows are tested against, and why it is that row (see the module docstring)."""
    if wanted:
        named = [row for row in rows if row.label() == wanted] or sorted(
            (row for row in rows if row.attention == wanted), key=lambda row: not row.plain)
        return (named[0], "chosen with --baseline") if named else (None, f"--baseline {wanted!r} names no row here")
    reasons = []
    for attention in DEFAULT_BASELINES:
        plain = next((row for row in rows if row.attention == attention and row.plain), None)
        others = [row.label() for row in rows if row.attention == attention]
        reason = (f"the {attention} row{'s' if len(others) > 1 else ''} ({'; '.join(others)}) "
                  f"change{'' if len(others) > 1 else 's'} the plain recipe"
                  if plain is None and others else unusable(plain, attention))
        if reason is None:
            return plain, f"the plain-recipe {attention} row" + (f" ({' and '.join(reasons)})" if reasons else "")
        reasons.append(reason)
    for row in rows:
        if row.plain and row.attention not in DEFAULT_BASELINES and unusable(row, row.attention) is None:
            return row, f"the first plain-recipe row with predictions off chance: {' and '.join(reasons)}"
    return None, f"no plain-recipe row has predictions off chance ({' and '.join(reasons)}); --baseline ROW chooses one"


def paired_test(row: Row, baseline: Row | None) -> dict | None:
    """McNemar's exact test of ``row`` against ``baseline`` on the same examples: the row's lowest seed with
    predictions, against the baseline's run of that seed (else its lowest seed with predictions)."""
    if baseline is None or baseline is row or row.data != baseline.data:
        return None
    theirs = sorted((run for run in baseline.completed() if predictions(run)), key=lambda run: run["seed"])
    for run in sorted((run for run in row.completed() if predictions(run)), key=lambda run: run["seed"]):
        other = next((o for o in theirs if o["seed"] == run["seed"]), theirs[0] if theirs else None)
        if other is not None and (result := compare_predictions(predictions(run), predictions(other), PAIRED_SPLITS)):
            split, test = result
            seeds = f"seed {run['seed']}" + (f" vs {other['seed']}" if other["seed"] != run["seed"] else "")
            return {"p": test.p, "on": f"{split}, {seeds}", "b": test.b, "c": test.c}
    return None


def summarize(rows: list[Row], tables: dict, baseline: str | None = None) -> list[dict]:
    """One flat dict per row (the tables' and the figures' input)."""
    baselines = {task: choose_baseline([row for row in rows if row.task == task], baseline)
                 for task in {row.task for row in rows}}
    out = []
    for row in rows:
        test_mean, test_std = percent_stats(row, "test_acc")
        independent_mean, independent_std = percent_stats(row, "independent_test_acc")
        speed, memory = row.values("samples_per_s"), row.values("peak_mem_bytes")
        steps, seconds = row.values("steps"), row.values("train_time_s")
        published = published_for(row, tables) if row.completed() else None  # nothing of ours to set beside it
        compared = independent_mean if independent_mean is not None else test_mean
        cue, shortcut = shortcut_scores(row)
        chosen, why = baselines[row.task]
        paired = paired_test(row, chosen)
        out.append({
            "task": row.task, "attention": row.attention, "setting": row.setting(), "label": row.label(),
            "plain": row.plain, "seeds": row.seeds(), "failed": row.status_count("failed"),
            "interrupted": row.status_count("interrupted"), "missing": row.status_count("missing", "not_started"),
            "test_acc_mean": test_mean, "test_acc_std": test_std,
            "independent_test_acc_mean": independent_mean, "independent_test_acc_std": independent_std,
            "cue_val": cue.get("val"), "cue_test": cue.get("test"), "cue_independent_test": cue.get(INDEPENDENT_TEST),
            "shortcut": shortcut,
            "val_acc_best_mean": percent_stats(row, "val_acc_best")[0],
            "steps": round(statistics.fmean(steps)) if steps else None,
            "train_time_min": statistics.fmean(seconds) / 60 if seconds else None,
            "samples_per_s": statistics.fmean(speed) if speed else None,
            "peak_mem_mib": statistics.fmean(memory) / 2**20 if memory else None,
            "published": published["acc"] if published else None,
            "published_table": published["table"] if published else None,
            "published_note": published["note"] if published and published["acc"] is None else None,
            "delta": compared - published["acc"] if published and published["acc"] is not None and compared is not None else None,
            "baseline": chosen.label() if chosen else None, "baseline_reason": why,
            "is_baseline": row is chosen,
            "p_value": paired["p"] if paired else None, "paired_on": paired["on"] if paired else None,
            "num_classes": lookup(row.runs[0].get("config") or {}, "task.num_classes") if row.runs else None,
            "device": lookup(row.runs[0].get("config") or {}, "trainer.accelerator") if row.runs else None,
        })
    return out
