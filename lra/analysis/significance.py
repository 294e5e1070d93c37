"""Paired significance between two models tested on the same examples: McNemar's exact test.

Two classifiers A and B predict the same ``n`` examples (``predictions.json`` beside each run's
``results.json``, written by ``lra.train``). Only the discordant examples carry information:
``b`` = A right and B wrong, ``c`` = A wrong and B right. Under the null hypothesis (equal
accuracy) each discordant example goes either way with probability 1/2, so ``min(b, c)`` is
Binomial(b + c, 1/2) and the two-sided exact p-value is

    p = min(1, 2 · Σ_{k=0}^{min(b,c)} C(b+c, k) / 2^{b+c})

(McNemar 1947; the exact binomial form, as recommended for small b + c by Fagerland et al. 2013).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class McNemar:
    """Discordant counts ``b`` (only A right), ``c`` (only B right) over ``n`` paired examples, and ``p``."""

    b: int
    c: int
    n: int
    p: float


def binomial_tail(k: int, trials: int) -> float:
    """``P(X <= k)`` for ``X ~ Binomial(trials, 1/2)``, summed in log space (exact for any ``trials``)."""
    log_half = trials * math.log(0.5)
    terms = [math.lgamma(trials + 1) - math.lgamma(i + 1) - math.lgamma(trials - i + 1) + log_half for i in range(k + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def mcnemar(pred_a: list[int], pred_b: list[int], labels: list[int]) -> McNemar:
    """McNemar's exact test of two prediction lists against the same ``labels``."""
    if not len(pred_a) == len(pred_b) == len(labels):
        raise ValueError(f"paired predictions must cover the same examples: {len(pred_a)}, {len(pred_b)} and "
                         f"{len(labels)} labels")
    right_a = [p == y for p, y in zip(pred_a, labels)]
    right_b = [p == y for p, y in zip(pred_b, labels)]
    b = sum(a and not o for a, o in zip(right_a, right_b))
    c = sum(o and not a for a, o in zip(right_a, right_b))
    p = 1.0 if b + c == 0 else min(1.0, 2 * binomial_tail(min(b, c), b + c))
    return McNemar(b, c, len(labels), p)


def read_predictions(run_dir: str | Path) -> dict | None:
    """``predictions.json`` of a run (``{split: {"pred": [...], "label": [...]}}``), or None when it has none."""
    path = Path(run_dir) / "predictions.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error}); delete it and re-test the run's best checkpoint "
                         "with lra.evaluate") from error


def same_examples_split(a: dict, b: dict, splits: tuple[str, ...]) -> str | None:
    """The first of ``splits`` both prediction files (:func:`read_predictions`) hold for the same examples (the same
    labels in the same order), else None: McNemar pairs examples, so runs tested on other data are not compared."""
    return next((split for split in splits if split in a and split in b and a[split]["label"] == b[split]["label"]), None)


def compare_predictions(a: dict, b: dict, splits: tuple[str, ...]) -> tuple[str, McNemar] | None:
    """McNemar between two runs' predictions on the first of ``splits`` both hold for the same examples, else None."""
    split = same_examples_split(a, b, splits)
    return None if split is None else (split, mcnemar(a[split]["pred"], b[split]["pred"], a[split]["label"]))
