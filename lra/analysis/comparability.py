"""Is a run comparable with a published number? (``lra/analysis/published.yaml``; used by ``lra.analysis.report``.)

A published row may carry ``setting``: the settings of the number's source that our config can
express, as ``{all: {key: value}, <task>: {key: value}}`` (``all`` for every task, the task's map
on top). Keys are dotted config paths of the run's resolved config (``model.block.norm``) or one
derived key, ``attention_function`` (``softmax`` | ``laplace``: ``model.block.attention_function``
when set, else the MEGA attention node's ``function``). A value ``"<set>"`` only asks for the key to
be present and not null (e.g. ``ckpt_path`` of a transferred model). A row may instead carry
``incomparable: <why>`` when its source used a setting our code does not reproduce at all.
``setting_source`` names the source in the reason.

A table (or one of its rows, replacing it) may carry ``protocol``: per task the training length, batch size
and training-set size its numbers were trained with (``{<task>: {steps, batch_size, train_examples}}``, a key
left out is not checked) and ``protocol_source``. A completed run must match them (:func:`protocol_mismatches`):
``steps`` is the record's optimizer steps, the batch size ``task.batch_size`` × ``trainer.devices`` ×
``trainer.accumulate_grad_batches``, the training set the record's ``train_examples`` (else the generated
train size of the config; unknown: not checked). A 20-step run on 2,000 examples reads
``not comparable: 20 steps (CUR paper: 5,000), 2,000 training examples (96,000)``.

    comparability(config, entry) -> None | "not comparable: <why>"
    published_for(row, tables) -> the published entry a report row is set beside (or why none is)

Example (CUR paper Table 1, Mega row, Ma et al. 2022): our default 2-layer d64 MEGA on ListOps gives
``not comparable: model.num_layers=2 (Ma et al. 2022: 6), model.d_model=64 (80), ... (+12 more)``.
"""

from __future__ import annotations

import math
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

PUBLISHED = Path(__file__).with_name("published.yaml")  # the papers' numbers lra.analysis.report prints
SET = "<set>"
FUNCTION_NAMES = {"attention.mega.Softmax": "softmax", "attention.mega.Laplace": "laplace"}
SHOWN = 4  # mismatches named in a reason; the rest are counted
SECTIONS = ("all", "listops", "text", "retrieval", "image", "pathfinder", "pathx")


_nodes: dict[int, tuple[dict, DictConfig]] = {}  # id(config) -> (config, its OmegaConf node): built once per record


def config_node(config: dict) -> DictConfig:
    """``config`` as an OmegaConf node, built once per dict (a report looks up hundreds of keys per record)."""
    cached = _nodes.get(id(config))
    if cached is None or cached[0] is not config:
        cached = _nodes[id(config)] = (config, OmegaConf.create(config))
    return cached[1]


def lookup(config: dict, key: str):
    """The run's value at dotted ``key`` (interpolations resolved where possible), or None."""
    node = config_node(config)
    if key == "attention_function":
        chosen = OmegaConf.select(node, "model.block.attention_function", default=None, throw_on_resolution_failure=False)
        target = OmegaConf.select(node, "attention.function._target_", default=None, throw_on_resolution_failure=False)
        return chosen if chosen is not None else FUNCTION_NAMES.get(target, target)
    value = OmegaConf.select(node, key, default=None, throw_on_resolution_failure=False)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def same(ours, theirs) -> bool:
    """Equal values; numbers within float round-off, bools only equal to bools, lists element-wise."""
    if theirs == SET:
        return ours is not None
    if isinstance(theirs, bool) or isinstance(ours, bool):
        return type(ours) is type(theirs) and ours == theirs
    if isinstance(theirs, (int, float)) and isinstance(ours, (int, float)):
        return math.isclose(ours, theirs, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(theirs, (list, tuple)) and isinstance(ours, (list, tuple)):
        return len(ours) == len(theirs) and all(same(a, b) for a, b in zip(ours, theirs))
    return ours == theirs


def required(entry: dict, task: str) -> dict:
    """The entry's ``setting`` for ``task``: the task's own keys first (sizes name the biggest differences), then ``all``."""
    setting = entry.get("setting") or {}
    unknown = set(setting) - set(SECTIONS)
    if unknown:
        raise ValueError(f"published row {entry.get('attention')!r}: setting has unknown sections {sorted(unknown)}; "
                         f"use {SECTIONS} (lra/analysis/published.yaml)")
    own = setting.get(task) or {}
    return {**own, **{key: value for key, value in (setting.get("all") or {}).items() if key not in own}}


def comparability(config: dict, entry: dict, runs: list[dict] = (), protocol: dict | None = None,
                  protocol_source: str = "paper") -> str | None:
    """None if the run (resolved ``config``, completed records ``runs``) matches what ``entry``'s source ran (its
    ``setting`` and the task's ``protocol``), else a short reason."""
    if entry.get("incomparable"):
        return f"not comparable: {entry['incomparable']}"
    task = lookup(config, "task.name")
    source = entry.get("setting_source", "source")
    ours = {key: lookup(config, key) for key in required(entry, str(task))}
    mismatches = [(f"{key}={ours[key]}", source, value)
                  for key, value in required(entry, str(task)).items() if not same(ours[key], value)]
    mismatches += protocol_mismatches(list(runs), protocol or {}, protocol_source)
    return not_comparable(mismatches)


def task_protocol(table: dict, entry: dict, task: str) -> tuple[dict, str]:
    """The protocol ``entry``'s number was trained with on ``task`` (the entry's own, else its table's) and
    whose it is."""
    if "protocol" in entry:
        return (entry["protocol"] or {}).get(task) or {}, entry.get("setting_source", "source")
    return (table.get("protocol") or {}).get(task) or {}, table.get("protocol_source", "paper")


def batch_size(config: dict) -> int | None:
    """Examples per optimizer step: ``task.batch_size`` × devices (when a number) × gradient accumulation."""
    size = lookup(config, "task.batch_size")
    if not isinstance(size, int):
        return None
    devices, accumulate = lookup(config, "trainer.devices"), lookup(config, "trainer.accumulate_grad_batches")
    return size * (devices if isinstance(devices, int) and devices > 0 else 1) * (accumulate or 1)


def measured_protocol(run: dict) -> dict[str, int | None]:
    """What a run trained with, in :data:`PROTOCOL_NAMES`' keys (None: not known from its record)."""
    config = run.get("config") or {}
    examples = run.get("train_examples")
    if examples is None:
        examples = lookup(config, "task.datamodule.generate.sizes.train")
    return {"steps": run.get("steps"), "batch_size": batch_size(config), "train_examples": examples}


PROTOCOL_NAMES = {"steps": "{:,} steps", "batch_size": "batch {:,}", "train_examples": "{:,} training examples"}


def protocol_mismatches(runs: list[dict], protocol: dict, source: str) -> list[tuple[str, str, str]]:
    """How the completed ``runs`` differ from ``protocol`` (``{steps, batch_size, train_examples}``) as
    ``(ours, source, theirs)``, e.g. ``("20 steps", "paper", "5,000")``; each difference once, from the first run."""
    found: dict[str, tuple[str, str, str]] = {}
    for run in (run for run in runs if run.get("status") == "completed"):
        for key, ours in measured_protocol(run).items():
            theirs = protocol.get(key)
            if key not in found and theirs is not None and ours is not None and ours != theirs:
                found[key] = (PROTOCOL_NAMES[key].format(ours), source, f"{theirs:,}")
    return [found[key] for key in PROTOCOL_NAMES if key in found]


def not_comparable(mismatches: list[tuple[str, str, object]]) -> str | None:
    """``not comparable: <ours> (<source>: <theirs>), <ours> (<theirs>), ... (+k more)`` (a source named where it
    changes), or None without mismatches."""
    if not mismatches:
        return None
    shown, named = [], None
    for ours, source, theirs in mismatches[:SHOWN]:
        shown.append(f"{ours} ({theirs})" if source == named else f"{ours} ({source}: {theirs})")
        named = source
    more = f" (+{len(mismatches) - SHOWN} more)" if len(mismatches) > SHOWN else ""
    return "not comparable: " + ", ".join(shown) + more


def published_for(row, tables: dict) -> dict | None:
    """The published row for a report row (``lra.analysis.report.Row``): tables named in the runs' tags first, then file order; a row's
    ``match`` settings must hold in the runs' config, and its source's settings must be the run's
    (:func:`lra.analysis.comparability.comparability`). With no comparable row, a matching one comes back with
    ``acc`` None and the reason in ``note``: the first whose settings or protocol the run misses, else the first
    marked ``incomparable``."""
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
            reason = comparability(config, entry, row.completed(), *task_protocol(table, entry, row.task))
            if reason:  # the reason shown: the first row the run's settings miss, else the first incomparable one
                if refused is None or (refused["inherent"] and not entry.get("incomparable")):
                    refused = {"acc": None, "std": None, "table": name, "source": table["source"], "note": reason,
                               "inherent": bool(entry.get("incomparable"))}
                continue
            std = entry.get("std")
            return {"acc": entry["acc"][column], "std": std[column] if std else None, "table": name,
                    "source": table["source"], "note": entry.get("note", "")}
    if refused is not None:
        del refused["inherent"]
    return refused
