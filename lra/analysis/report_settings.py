"""What a run changes from its task's plain recipe, named compactly: the report's ``setting`` column.

The plain recipe of a run is ``configs/train.yaml`` composed with the run's ``task=``, ``attention=`` (and
``experiment=``, a named recipe) choices, as ``python -m lra.train`` would compose it today. Each other
override of the run is a :class:`Part` of its setting when its value differs from the recipe's (a group
override such as ``model/positions=rotary`` by the chosen option; a value by equality, numbers within
round-off), so ``attention.selection=abs`` on CURformer (its default) names nothing. Parts are named
short and in a fixed order (what is trained, then how, then where): ``selection=sum``,
``positions=rotary · pretrain 2,500``, ``lr 1e-3 · 3,000 steps · GPU``.

Not part of a setting: the seed, W&B ``group``/``tags``, the logger, ``paths.*``, ``hydra.*``, what the console
shows (``verbose``, ``callbacks.progress``) and ``task.eval_every`` (how often validation runs, which only picks the tested checkpoint among more or fewer
candidates). ``task.data_dir`` is a part (``data listops_full``) named by its path from its ``data`` folder
on, so the same generated data in two checkouts is one dataset.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from lra import REPO_ROOT
from lra.analysis.comparability import same
from lra.analysis.report_runs import warn
from lra.config import CONFIG_DIR

IDENTITY = ("task", "attention", "seed")  # the row's own columns (seed: a row's runs differ in it by design)
BOOKKEEPING = ("group", "tags", "logger", "paths", "hydra", "task.eval_every", "verbose", "callbacks.progress")
DATA = "task.data_dir"
FORMS = "forms"  # a part from results.json's forms (lra.train: the code each attention op ran), not an override
RECIPE_GROUPS = ("experiment",)  # choices that select a named recipe: composed into the recipe, and named
# (prefix, rank): a part's place in the setting, the first prefix that matches
ORDER = (("task.data_dir", 0), ("experiment", 1), ("attention", 2), ("model.compile", 11), ("model", 3),
         ("finetune", 4), ("init_from", 5), ("pretrain", 6), ("optimizer", 7), ("scheduler", 8), ("task", 9),
         ("trainer.", 9), ("trainer", 10))
# how a part is named; fields: text (as written), number (an integer with thousands separators), upper,
# name (a path's last component), checkpoint (<run dir>/<checkpoint>), last (the key's last component)
NAMES = {
    "task.data_dir": "data {name}", "experiment": "experiment {text}", "init_from": "init {checkpoint}",
    "optimizer.lr": "lr {text}", "pretrain.lr": "pretrain lr {text}", "pretrain.steps": "pretrain {number}",
    "trainer.max_steps": "{number} steps", "task.max_steps": "{number} steps", "task.warmup_steps": "warmup {number}",
    "task.batch_size": "batch {number}", "trainer.max_time": "max time {text}", "trainer": "{upper}",
    "trainer.gradient_clip_val": "clip {text}", "trainer.precision": "{text}",
}
ABSENT = object()


@dataclass(frozen=True)
class Part:
    """One difference from the recipe: ``key``, ``value`` (as runs are compared by it) and ``text`` (its name)."""

    key: str
    value: str
    text: str

    @property
    def rank(self) -> int:
        """Its place in the setting: the rank of the first :data:`ORDER` prefix that matches its key."""
        for prefix, rank in ORDER:
            if self.key == prefix or self.key.startswith(prefix if prefix.endswith(".") else (prefix + ".", prefix + "/")):
                return rank
        return len(ORDER)


def matches(key: str, names: tuple[str, ...]) -> bool:
    return any(key == name or key.startswith((name + ".", name + "/")) for name in names)


def data_identity(path: str) -> str:
    """A data dir as runs are compared by it: from its last ``data`` folder on (``data/listops_full``), else the
    absolute path; relative paths are taken from the checkout."""
    absolute = Path(path) if Path(path).is_absolute() or "$" in path else REPO_ROOT / path
    parts = absolute.parts
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("data"):]) if "data" in parts else str(absolute)


def last(key: str) -> str:
    return key.replace("/", ".").rsplit(".", 1)[-1]


def name(key: str, text: str, value, full: bool = False) -> str:
    """The part's name in the setting column (:data:`NAMES`, else ``<last key component>=<value>``, or the whole key
    when ``full``: two keys of one run end alike, ``model.dropout`` and ``attention.dropout``)."""
    path = Path(str(text))
    fields = {"text": text, "upper": str(text).upper(), "checkpoint": f"{path.parent.name}/{path.stem}",
              "name": data_identity(str(text)).removeprefix("data/"),
              "number": f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else text,
              "last": key if full else last(key)}
    return NAMES.get(key, "{last}={text}").format(**fields)


@functools.cache
def recipe(choices: tuple[str, ...]):
    """``configs/train.yaml`` composed with ``choices`` (``task=…``, ``attention=…``), Hydra's choices included;
    None (with a warning) when it does not compose (a task or attention renamed since the run)."""
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose(config_name="train", overrides=list(choices), return_hydra_config=True)
    except Exception as error:
        warn(f"could not compose the plain recipe {' '.join(choices)} ({type(error).__name__}: {error}); "
             "its runs' settings name every override")
        return None


def recipe_value(config, key: str):
    """The recipe's value at ``key``: the chosen option of a config group, else the (resolved) value."""
    choices = config.hydra.runtime.choices
    if key in choices:
        return choices[key]
    value = OmegaConf.select(config, key, default=ABSENT, throw_on_resolution_failure=False)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def differs(config, key: str, value, is_group: bool) -> bool:
    if config is None:
        return True
    ours = recipe_value(config, key)
    if key == DATA and isinstance(ours, str) and isinstance(value, str):
        return data_identity(ours) != data_identity(value)
    return ours is ABSENT or not (str(ours) == str(value) if is_group else same(value, ours))


def setting_parts(run: dict) -> tuple[Part, ...]:
    """The parts of ``run``'s setting (its overrides that differ from its plain recipe), in :data:`ORDER`."""
    parser = OverridesParser.create()
    parsed = []
    for override in run.get("overrides") or []:
        try:
            parsed.append((override, parser.parse_override(override)))
        except Exception:  # not Hydra syntax (a hand-written record): named as written
            parsed.append((override, None))
    chosen = {item.key_or_group: str(item.value()) for _, item in parsed if item is not None}
    choices = (f"task={chosen.get('task', run['task'])}", f"attention={chosen.get('attention', run['attention'])}",
               *(f"{group}={chosen[group]}" for group in RECIPE_GROUPS if group in chosen))
    config = recipe(choices)
    endings = [last(item.key_or_group) for _, item in parsed if item is not None and item.key_or_group not in NAMES]
    parts = []
    for raw, item in parsed:
        if item is None:
            parts.append(Part(raw, raw, raw))
            continue
        key, text = item.key_or_group, raw.split("=", 1)[1] if "=" in raw else ""
        if key in IDENTITY or matches(key, BOOKKEEPING):
            continue
        if item.is_delete():
            parts.append(Part(key, "<deleted>", f"no {key}"))
            continue
        value = item.value()
        is_group = config is not None and key in config.hydra.runtime.choices
        if key in RECIPE_GROUPS or differs(config, key, value, is_group):
            compared = data_identity(str(value)) if key == DATA else str(value)
            parts.append(Part(key, compared, name(key, text, value, full=endings.count(last(key)) > 1)))
    forms = run.get("forms")  # what ran (results.json, attention.impl's resolved forms): shown where a variant's differ
    if isinstance(forms, dict):
        text = " ".join(f"{op}={form}" for op, form in forms.items() if op != "impl")
        parts.append(Part(FORMS, text, f"forms {text}"))
    return tuple(sorted(parts, key=lambda part: part.rank))
