"""The run records a report reads: every ``results.json`` under the given dirs, checked, plus job dirs without one.

A record that cannot be read (not UTF-8, not JSON, a field of the wrong type, an accuracy outside [0, 1]) is
skipped with a warning on stderr naming the file and the reason; the other runs still make their tables.
A Hydra job dir with ``.hydra/config.yaml`` but no ``results.json`` is a run that died or is still running
("missing"); a sweep records jobs it has not reached as "not_started", counted as missing too.
"""

from __future__ import annotations

import json
import math
import sys
from datetime import datetime
from pathlib import Path

import yaml

from lra.analysis.comparability import lookup
from lra.tasks.listops_vocab import INDEPENDENT_TEST

STATUSES = ("completed", "failed", "interrupted", "missing", "not_started")
# fractions of examples right: an accuracy written in % (25.2) would print as 2520 %
FRACTIONS = ("test_acc", "val_acc_best", "independent_test_acc", "shortcut_val_acc", "shortcut_test_acc",
             f"shortcut_{INDEPENDENT_TEST}_acc")
AMOUNTS = ("steps", "train_time_s", "samples_per_s", "peak_mem_bytes", "train_examples")  # numbers >= 0


class UnreadableRun(ValueError):
    """A ``results.json`` the report cannot use; the message says why."""


def warn(message: str) -> None:
    print(f"[lra] warning: {message}", file=sys.stderr, flush=True)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_record(record) -> None:
    """Raise :class:`UnreadableRun` naming the first field a report cannot use."""
    if not isinstance(record, dict):
        raise UnreadableRun(f"expected a JSON object, found {type(record).__name__}")
    for key in ("task", "attention"):
        if not isinstance(record.get(key), str) or not record[key]:
            raise UnreadableRun(f"{key} is {record.get(key)!r}: expected a name")
    if record.get("status") not in STATUSES:
        raise UnreadableRun(f"status is {record.get('status')!r}: expected one of {', '.join(STATUSES)}")
    if not isinstance(record.get("seed"), int) or isinstance(record.get("seed"), bool):
        raise UnreadableRun(f"seed is {record.get('seed')!r}: expected an integer")
    for key in FRACTIONS:
        value = record.get(key)
        if value is not None and not (is_number(value) and 0 <= value <= 1):
            raise UnreadableRun(f"{key} is {value!r}: expected a fraction in [0, 1] (0.352 for 35.2 %)")
    for key in AMOUNTS:
        value = record.get(key)
        if value is not None and not (is_number(value) and value >= 0):
            raise UnreadableRun(f"{key} is {value!r}: expected a number >= 0")
    if not isinstance(record.get("overrides", []), list) or not all(isinstance(o, str) for o in record.get("overrides", [])):
        raise UnreadableRun(f"overrides is {record.get('overrides')!r}: expected a list of 'key=value' strings")
    if not isinstance(record.get("config") or {}, dict):
        raise UnreadableRun(f"config is {type(record['config']).__name__}: expected a JSON object")
    for point in record.get("val_curve") or []:
        if not (isinstance(point, list) and len(point) == 2 and is_number(point[0]) and is_number(point[1])
                and 0 <= point[1] <= 1):
            raise UnreadableRun(f"val_curve holds {point!r}: expected [step, accuracy in [0, 1]] pairs")


def load_run(path: Path) -> dict:
    """``path`` (a ``results.json``) as a checked record with ``path`` (its run dir), ``written`` (its mtime),
    ``overrides`` and ``tags``; :class:`UnreadableRun` when it cannot be used."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise UnreadableRun(f"not UTF-8 text (byte {error.object[error.start:error.start + 1]!r} at offset "
                            f"{error.start}): the file is damaged") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise UnreadableRun(f"not valid JSON ({error}); the run was probably killed while writing it: delete the "
                            "file and re-run the job (it resumes from its last checkpoint)") from None
    check_record(record)
    record.update(path=str(path.parent), written=path.stat().st_mtime)
    record.setdefault("overrides", [])
    record["tags"] = list((record.get("config") or {}).get("tags") or [])
    return record


def load_missing(job_dir: Path) -> dict:
    """A Hydra job dir without ``results.json``: killed, crashed hard, or still running."""
    config_file = job_dir / ".hydra" / "config.yaml"
    try:
        config = yaml.safe_load(config_file.read_text())
        overrides_file = job_dir / ".hydra" / "overrides.yaml"
        overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.exists() else []
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise UnreadableRun(f"{type(error).__name__}: {error}") from None
    if not isinstance(config, dict):
        raise UnreadableRun("expected a YAML mapping")
    return {
        "task": lookup(config, "task.name"), "attention": lookup(config, "attention.name"), "seed": config.get("seed"),
        "status": "missing", "error": "no results.json (killed, crashed or still running)", "path": str(job_dir),
        "written": config_file.stat().st_mtime, "overrides": overrides or [], "tags": list(config.get("tags") or []),
        "config": config,
    }


def collect(dirs: list[Path]) -> list[dict]:
    """Every run under ``dirs``: one record per readable ``results.json`` plus one per job dir that has none;
    unreadable ones are skipped with a warning."""
    runs = []
    for root in dirs:
        if not root.is_dir():
            raise FileNotFoundError(f"sweep dir not found: {root} (pass a multirun dir, e.g. outputs/multirun/<date>)")
        found = [(load_run, path) for path in sorted(root.rglob("results.json"))]
        found += [(load_missing, cfg.parent.parent) for cfg in sorted(root.rglob(".hydra/config.yaml"))
                  if not (cfg.parent.parent / "results.json").exists()]
        for load, path in found:
            try:
                runs.append(load(path))
            except (UnreadableRun, OSError) as error:
                shown = path if load is load_run else path / ".hydra" / "config.yaml"
                warn(f"skipped {shown}: {error}")
    return runs


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
        summary = run.summary  # results.json's scalars under lra.runtime.wandb_summary's names
        config = dict(run.config.get("config") or run.config)  # runs logged before lra.runtime.wandb_summary: at the top
        record = {
            "task": lookup(config, "task.name"), "attention": lookup(config, "attention.name"), "seed": config.get("seed"),
            "status": summary.get("status") or states.get(run.state, "failed"),
            "error": summary.get("error") or f"W&B state {run.state}",
            "test_acc": summary.get("test/acc"), "val_acc_best": summary.get("val/acc_best"),
            "independent_test_acc": summary.get(f"{INDEPENDENT_TEST}/acc"), "steps": summary.get("steps"),
            "train_time_s": summary.get("train_time_s"), "samples_per_s": summary.get("perf/samples_per_s"),
            "peak_mem_bytes": summary.get("perf/peak_mem_bytes"), "train_examples": summary.get("train_examples"),
            "shortcut": summary.get("shortcut"),
            **{key: summary.get(f"{key.removesuffix('_acc')}/acc") for key in FRACTIONS if key.startswith("shortcut_")},
            "overrides": list(run.config.get("overrides") or []), "tags": list(run.tags), "config": config,
            "path": run.url, "written": datetime.fromisoformat(str(run.created_at).replace("Z", "+00:00")).timestamp(),
        }
        try:
            check_record(record)
        except UnreadableRun as error:
            warn(f"skipped W&B run {run.url}: {error}")
            continue
        records.append(record)
    return records
