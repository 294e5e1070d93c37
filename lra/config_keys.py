"""Config values checked against what they configure, so a mistake names its key instead of failing inside torch.

- :func:`check_keys`: every key of a ``_target_`` node must be a parameter of the target's constructor. A typo
  (``+attention.num_landmark=32``, the ``+`` Hydra suggests for a key it does not know) names the keys the
  target takes. The keys come from the signature, so every variant is covered as it is written.
- :func:`check_probabilities`: every ``dropout`` / ``*_dropout`` value of the model, attention and fine-tuning
  nodes must lie in [0, 1).
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from hydra.utils import get_object
from torch import nn

HYDRA_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_", "_args_"})
PROBABILITY_NODES = ("model", "attention", "finetune")


def is_target_node(value: Any) -> bool:
    return isinstance(value, dict) and "_target_" in value


def named_parameters(target) -> tuple[set[str], bool]:
    """The keyword parameters ``target`` (a class or function) takes, and whether it also takes ``**kwargs``."""
    function = target.__init__ if inspect.isclass(target) else target
    parameters = list(inspect.signature(function).parameters.values())
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
    return names, any(p.kind == p.VAR_KEYWORD for p in parameters)


def accepted_keys(target, node: dict) -> set[str]:
    """The keys ``target``'s constructor accepts. One that takes ``**kwargs`` passes them on, to its base class
    (``CUR(**knobs)`` -> ``CURAttention``) or to a factory it is given (MEGA's ``approximation``): their keys count
    too. ``nn.Module`` and ``object`` take none (``nn.Module.__init__`` refuses what it is given)."""
    names, passes_on = named_parameters(target)
    if not passes_on:
        return names
    if inspect.isclass(target):
        base = next((cls for cls in target.__mro__[1:] if "__init__" in vars(cls)), object)
        if base not in (nn.Module, object):
            names |= accepted_keys(base, {})
    for value in node.values():
        if is_target_node(value) and value.get("_partial_"):
            names |= accepted_keys(get_object(value["_target_"]), value) - set(value)
    return names


def check_keys(node: dict, prefix: str, supplied: tuple[str, ...] = (), descriptive: tuple[str, ...] = ()) -> None:
    """Raise ``ValueError`` naming ``<prefix>.<key>`` and the valid keys when ``node`` (a plain ``_target_`` config
    node) or a ``_target_`` node inside it holds a key its target's constructor does not take. ``supplied``: the
    arguments the caller passes itself (not config keys); ``descriptive``: keys that describe the node only."""
    target = get_object(node["_target_"])
    accepted = accepted_keys(target, node)
    given = set(node) - HYDRA_KEYS - set(descriptive)
    label = f"{prefix}={node['name']}" if "name" in descriptive and "name" in node else prefix
    for key in sorted(given - accepted):
        valid = sorted(accepted - set(supplied))
        close = difflib.get_close_matches(key, valid, n=1)
        guess = f"did you mean {prefix}.{close[0]}? " if close else ""
        raise ValueError(f"{prefix}.{key} is not a key of {label} ({node['_target_']}): {guess}the keys it takes: "
                         f"{', '.join(valid)}. Drop the key or correct its name")
    for key, value in node.items():
        if is_target_node(value):
            check_keys(value, f"{prefix}.{key}")


def probabilities(node: Any, prefix: str):
    """``(key, value)`` of every ``dropout`` or ``*_dropout`` key under ``node``."""
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key == "dropout" or key.endswith("_dropout"):
            yield f"{prefix}.{key}", value
        yield from probabilities(value, f"{prefix}.{key}")


def check_probabilities(config: dict) -> None:
    """Raise ``ValueError`` naming the key when a dropout probability of ``config`` (a resolved config as plain
    values) is not a number in [0, 1)."""
    for group in PROBABILITY_NODES:
        for key, value in probabilities(config.get(group), group):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"{key} must be a probability in [0, 1) (got {value!r}): the share of activations "
                                 f"zeroed while training; e.g. {key}=0.1, or {key}=0 for none")
