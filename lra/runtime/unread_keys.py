"""Every key of a run's config is read by something: a key the command line adds that nothing reads is refused
before anything runs, naming it and the closest key that exists (``difflib``).

The known schema is the composed config itself: the keys of ``configs/`` (and of the group choices and experiment
of the command) are what the code reads. A key that is new (``+key=value``, or ``++key=value`` where nothing had
it) is read only where a constructor takes it:

- inside a ``_target_`` node (``attention``, ``optimizer``, ``trainer``, ``task.datamodule`` ...): a parameter of
  the target's constructor (:func:`lra.config_keys.accepted_keys`; ``+trainer.max_step=2`` -> did you mean
  ``trainer.max_steps``?). Deeper keys belong to that argument's value;
- a new entry of a node whose entries are each instantiated (:data:`INSTANTIATED`:
  ``+callbacks.faults._target_=tests.faults.Faults``).

Anything else (``+lerning_rate=1``, ``+task.eval_evry=1``) is read by nothing and refused
(:func:`unread_additions`). A changed key that does not exist (``trainer.max_step=2``, no ``+``) is refused by Hydra
before composing, with the hint to add ``+``; :func:`missing_key_message` turns that into the same did-you-mean line
(``lra.train.main`` prints it after Hydra's message).
"""

from __future__ import annotations

import difflib
import re
import shlex

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from lra.config_keys import HYDRA_KEYS, accepted_keys

INSTANTIATED = ("callbacks", "logger")  # every entry of these is instantiated (lra.runtime.trainer)


def dotted_keys(node, prefix: str = "") -> list[str]:
    """Every key path of a plain config (``{"a": {"b": 1}}`` -> ``["a", "a.b"]``)."""
    keys = []
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            keys += [path, *dotted_keys(value, path)]
    return keys


def nearest(key: str, candidates: list[str]) -> str | None:
    """The candidate closest to ``key`` in spelling: by whole path, else by the last name (difflib, ratio >= 0.6)."""
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if close:
        return close[0]
    leaf = key.rsplit(".", 1)[-1]
    by_leaf = {candidate.rsplit(".", 1)[-1]: candidate for candidate in candidates}
    close = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)
    return by_leaf[close[0]] if close else None


def unread_reason(config: dict, key: str) -> str | None:
    """Why nothing reads the key path ``key`` of the plain config ``config`` (which holds it), or None when
    something does (module docstring)."""
    parts = key.split(".")
    node, in_target = config, False
    for depth in range(len(parts) - 1):
        node = node.get(parts[depth]) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            break
        if "_target_" not in node:
            continue
        in_target = True
        if parts[depth + 1] in HYDRA_KEYS:
            continue
        prefix, name = ".".join(parts[:depth + 1]), parts[depth + 1]
        try:
            accepted = accepted_keys(get_object(node["_target_"]), node)
        except Exception:  # a target that does not import: instantiating it names that
            return None
        if name not in accepted:
            guess = nearest(name, sorted(accepted))
            return (f"{prefix}.{name} is not a key of {prefix} ({node['_target_']})"
                    f"{f': did you mean {prefix}.{guess}?' if guess else '.'} The keys it takes: "
                    f"{', '.join(sorted(accepted))}")
    if in_target or (parts[0] in INSTANTIATED and len(parts) > 1):
        return None
    known = [path for path in dotted_keys(config) if path != key and not path.startswith(key + ".")
             and not path.startswith("hydra")]
    guess = nearest(key, known)
    parent = key.rsplit(".", 1)[0] if "." in key else None
    siblings = sorted(path.rsplit(".", 1)[-1] for path in known
                      if (path.rsplit(".", 1)[0] if "." in path else None) == parent)
    where = f"the keys of {parent}" if parent else "the top-level keys"
    return (f"{key} is a new key that nothing reads{f': did you mean {guess}?' if guess else ''} "
            f"({where}: {', '.join(siblings)})")


def added_keys(overrides: list[str]) -> list[tuple[str, str]]:
    """``(override, key)`` for each override that adds a key (``+key=`` / ``++key=``), config-group choices
    (``+finetune=lora``, ``+model/positions@...``) left out: their options are checked by
    :mod:`lra.runtime.config_groups`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lra.runtime.config_groups import group_options

    added = []
    for text, override in zip(overrides, OverridesParser.create().parse_overrides(overrides)):
        key = override.key_or_group
        if (override.is_add() or override.is_force_add()) and "/" not in key and override.package is None \
                and not key.startswith("hydra.") and not group_options(key):
            added.append((text, key))
    return added


def unread_additions(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """One message per key the command line adds (:func:`added_keys`) that nothing reads (:func:`unread_reason`)."""
    config = OmegaConf.to_container(cfg, resolve=False)
    config.pop("hydra", None)
    problems = []
    for text, key in added_keys(overrides):
        reason = unread_reason(config, key)
        if reason is not None:
            problems.append(f"{text}: {reason}. Drop it or correct its name")
    return problems


MISSING = re.compile(r"Could not override '([^']+)'")
COMPOSED: list[bool] = []  # set by lra.runtime.start_checks.StartChecks once Hydra has composed the command's config


def missing_key_message(argv: list[str]) -> str | None:
    """The did-you-mean line for a command whose ``key=value`` names a key the config does not have (Hydra refused
    it: "Could not override 'trainer.max_step'"), or None when composing fails for another reason (or not at all).
    Composes the command's config again (only after Hydra has refused it: a failed start costs the time)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra

    from lra.config import CONFIG_DIR

    try:
        args = get_args_parser().parse_args(argv)
    except (SystemExit, Exception):
        return None
    overrides = [o for o in (args.overrides or []) if not o.startswith("hydra")]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            try:
                compose(config_name=args.config_name or "train", overrides=overrides)
                return None
            except Exception as error:
                found = MISSING.search(str(error))
                if not found:
                    return None
                key = found.group(1)
                rest = [o for o in overrides if not re.match(rf"{re.escape(key)}=", o)]
                cfg = compose(config_name=args.config_name or "train", overrides=rest)
    except Exception:
        return None
    finally:
        GlobalHydra.instance().clear()
    config = OmegaConf.to_container(cfg, resolve=False)
    with_key = OmegaConf.create(config)
    OmegaConf.update(with_key, key, None, force_add=True)
    reason = unread_reason(OmegaConf.to_container(with_key), key)
    if reason is None:
        return None
    return f"[lra] FAILED: {key}=...: {reason}. Nothing was run or written"


def explained(entry) -> None:
    """Run ``entry`` (a ``hydra.main`` function); when Hydra refused a ``key=value`` whose key does not exist (exit 1
    after its own message), print the did-you-mean line of :func:`missing_key_message` last."""
    import sys

    COMPOSED.clear()
    try:
        entry()
    except SystemExit as exit_:  # composed: a job's own failure, not Hydra's refusal of the command line
        if exit_.code == 1 and not COMPOSED and (message := unquoted_text(sys.argv[1:])
                                                 or missing_key_message(sys.argv[1:])):
            print(message, file=sys.stderr, flush=True)
        raise


def unquoted_text(argv: list[str]) -> str | None:
    """The line for an override whose value Hydra cannot read unquoted because of a non-ASCII character
    (``hydra.run.dir=/tmp/é``: Hydra's "token recognition error"), with the quoted form, or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lra.runtime.job import hydra_value

    for text in argv:
        if "=" not in text or text.isascii() or text.startswith("-"):
            continue
        try:
            OverridesParser.create().parse_override(text)
        except Exception:
            key, value = text.split("=", 1)
            quoted = shlex.quote(f"{key}={hydra_value(value)}")
            return (f"[lra] FAILED: {text}: Hydra reads a value with non-ASCII characters only in quotes: write "
                    f"{quoted} (quotes for Hydra inside quotes for the shell). Nothing was run or written")
    return None
