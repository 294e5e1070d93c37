"""ListOps' first-operator cue: per root operator, the most frequent training label. Training scores it on every
evaluated split (:func:`lra.tasks.listops.first_operator_cue`, from token ids); the report, the dashboard and
:mod:`lra.analysis.listops_cue` read it from files and records. It lives apart from :mod:`lra.tasks.listops` and
imports no torch, so ``lra-report`` and ``lra-dashboard`` answer without first importing torch and Lightning (most
of a CLI's start-up; ``tests/test_install.py`` keeps it so).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from lra.tasks.listops_vocab import OPERATORS

FIRST_OPERATOR_CUE = "first-operator cue: the most frequent training label of the root operator"


def first_operator_rule(operators: Sequence[str], labels: Sequence[int]) -> dict[str, int]:
    """The first-operator cue fitted on ``(root operator, label)`` pairs: per operator its most frequent label
    (ties: the smallest; an operator never seen: 0). O(n)."""
    counts: dict[str, Counter] = {operator: Counter() for operator in OPERATORS}
    for operator, label in zip(operators, labels):
        counts[operator][int(label)] += 1
    return {op: min(c, key=lambda label: (-c[label], label)) if c else 0 for op, c in counts.items()}
