"""How far above the first-operator cue a *shallow* reading of ListOps goes: the root and its own digits.

    python -m lra.analysis.listops_shallow data/listops_full [--split independent_test]

The cue (:mod:`lra.analysis.listops_cue`) reads only the root operator. The rules here also read the
root's *top-level digits*, the digit arguments at bracket depth 1 (nested sub-expressions are counted,
never evaluated), and predict the most frequent training label of each value of their feature:

* ``root``: the cue itself;
* ``root + max digit`` / ``root + min digit`` / ``root + min and max digits`` of the top-level digits;
* ``root + its aggregate + nested``: the root operator applied to its top-level digits alone (MIN's minimum,
  MAX's maximum, MED's median, SM's sum mod 10) and the number of nested arguments (0, 1, 2, 3 or more).

Each rule is fitted on ``basic_train.tsv`` and scored on the chosen split; a feature value never seen in
training falls back to the cue. What these rules score is what a model gains from locating the root's own
digits, a depth-1 computation, before it evaluates any sub-expression.
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable

from lra.analysis.listops_cue import read_examples
from lra.tasks.listops_generator import evaluate
from lra.tasks.listops_vocab import INDEPENDENT_TEST, OPERATORS


@dataclass(frozen=True)
class TopLevel:
    """The root operator of a source, its digit arguments (in order) and its count of nested arguments."""

    root: str
    digits: tuple[int, ...]
    nested: int


def top_level(source: str) -> TopLevel:
    """Parse a source in the official bracketing (``( ( [MAX 2 ) 9 ) ] )``; parentheses are ignored)."""
    tokens = source.replace("(", " ").replace(")", " ").split()
    if not tokens or tokens[0] not in OPERATORS:
        raise ValueError(f"a ListOps source starts with an operator, got {source[:80]!r}")
    depth, digits, nested = 0, [], 0
    for token in tokens:
        if token in OPERATORS:
            depth += 1
            nested += depth == 2
        elif token == "]":
            depth -= 1
        elif depth == 1:
            digits.append(int(token))
    return TopLevel(tokens[0], tuple(digits), nested)


def aggregate(top: TopLevel) -> int | None:
    """The root operator over its top-level digits alone, as the task evaluates it (None without any)."""
    return evaluate((top.root, list(top.digits))) if top.digits else None


FEATURES: dict[str, Callable[[TopLevel], Hashable]] = {
    "root (the cue)": lambda t: t.root,
    "root + max digit": lambda t: (t.root, max(t.digits, default=None)),
    "root + min digit": lambda t: (t.root, min(t.digits, default=None)),
    "root + min and max digits": lambda t: (t.root, min(t.digits, default=None), max(t.digits, default=None)),
    "root + its aggregate + nested": lambda t: (t.root, aggregate(t), min(t.nested, 3)),
}


def most_frequent(counts: Counter) -> int:
    return min(counts, key=lambda label: (-counts[label], label))  # ties: the smallest label


def rule_accuracy(feature: Callable[[TopLevel], Hashable], train: list[tuple[TopLevel, int]],
                  examples: list[tuple[TopLevel, int]]) -> float:
    """Accuracy on ``examples`` of "the most frequent training label of this feature value" (unseen: the cue)."""
    by_value: dict[Hashable, Counter] = defaultdict(Counter)
    by_root: dict[str, Counter] = defaultdict(Counter)
    for top, label in train:
        by_value[feature(top)][label] += 1
        by_root[top.root][label] += 1
    right = 0
    for top, label in examples:
        counts = by_value.get(feature(top)) or by_root[top.root]
        right += most_frequent(counts) == label
    return right / len(examples)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m lra.analysis.listops_shallow", description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path, help="a folder with basic_train.tsv and basic_<split>.tsv")
    parser.add_argument("--split", default=INDEPENDENT_TEST, help="val | test | independent_test (default)")
    args = parser.parse_args(argv)
    train = [(top_level(source), label) for source, label in read_examples(args.data_dir / "basic_train.tsv")]
    path = args.data_dir / f"basic_{args.split}.tsv"
    examples = [(top_level(source), label) for source, label in read_examples(path)]
    print(f"shallow rules fitted on {len(train)} training examples, scored on {path} ({len(examples)} examples):")
    scores = {name: rule_accuracy(feature, train, examples) for name, feature in FEATURES.items()}
    for name, score in scores.items():
        print(f"  {name:32s} {100 * score:6.2f} %")
    return scores


if __name__ == "__main__":
    main()
