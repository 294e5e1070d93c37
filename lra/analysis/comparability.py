"""Is a run comparable with a published number? (``lra/analysis/published.yaml``; used by ``lra.analysis.report``.)

A published row may carry ``setting``: the settings of the number's source that our config can
express, as ``{all: {key: value}, <task>: {key: value}}`` (``all`` for every task, the task's map
on top). Keys are dotted config paths of the run's resolved config (``model.block.norm``) or one
derived key, ``attention_function`` (``softmax`` | ``laplace``: ``model.block.attention_function``
when set, else the MEGA attention node's ``function``). A value ``"<set>"`` only asks for the key to
be present and not null (e.g. ``ckpt_path`` of a transferred model). A row may instead carry
``incomparable: <why>`` when its source used a setting our code does not reproduce at all.
``setting_source`` names the source in the reason.

    comparability(config, entry) -> None | "not comparable: <why>"
    published_for(row, tables) -> the published entry a report row is set beside (or why none is)

Example (CUR paper Table 1, Mega row, Ma et al. 2022): our default 2-layer d64 MEGA on ListOps gives
``not comparable: model.num_layers=2 (Ma et al. 2022: 6), model.d_model=64 (80), ... (+12 more)``.
"""

from __future__ import annotations

import math
from pathlib import Path

from omegaconf import OmegaConf

PUBLISHED = Path(__file__).with_name("published.yaml")  # the papers' numbers lra.analysis.report prints
SET = "<set>"
FUNCTION_NAMES = {"attention.mega.Softmax": "softmax", "attention.mega.Laplace": "laplace"}
SHOWN = 4  # mismatches named in a reason; the rest are counted
SECTIONS = ("all", "listops", "text", "retrieval", "image", "pathfinder", "pathx")


def lookup(config: dict, key: str):
    """The run's value at dotted ``key`` (interpolations resolved where possible), or None."""
    node = OmegaConf.create(config)
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


def comparability(config: dict, entry: dict) -> str | None:
    """None if the run (resolved ``config``) matches what ``entry``'s source ran, else a short reason."""
    if entry.get("incomparable"):
        return f"not comparable: {entry['incomparable']}"
    task = lookup(config, "task.name")
    source = entry.get("setting_source", "source")
    ours = {key: lookup(config, key) for key in required(entry, str(task))}
    mismatches = [f"{key}={ours[key]} ({source}: {value})"
                  for key, value in required(entry, str(task)).items() if not same(ours[key], value)]
    if not mismatches:
        return None
    more = f" (+{len(mismatches) - SHOWN} more)" if len(mismatches) > SHOWN else ""
    shown = [mismatches[0]] + [m.replace(f"{source}: ", "") for m in mismatches[1:SHOWN]]
    return "not comparable: " + ", ".join(shown) + more


def published_for(row, tables: dict) -> dict | None:
    """The published row for a report row (``lra.analysis.report.Row``): tables named in the runs' tags first, then file order; a row's
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
