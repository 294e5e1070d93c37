"""How much of a ListOps label the top-level operator alone gives away.

The first operator token of a ListOps source is the root of its tree, and the root's operator skews
the label hard: over many arguments ``[MAX`` is mostly 9 and ``[MIN`` mostly 0 (~57 % each on
generated LRA-length data), ``[MED`` mostly 4 (~21 %), while ``[SM`` is near uniform (~10 %).
"Predict the most frequent training label of the first operator" therefore scores ~36 % on a split
with the four operators equally frequent, and its score on one 2,000-example split moves by a
few points with that split's operator mix. Compare trained models with this rule on the same split,
not only with the majority class (~17 %). Training records it per evaluated split in ``results.json``
(:func:`lra.tasks.listops.first_operator_cue`, on the token ids); this reads it from the files:

    python -m lra.analysis.listops_cue data/listops_full
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from lra.tasks.first_operator import first_operator_rule
from lra.tasks.listops_vocab import INDEPENDENT_TEST, OPERATORS

SPLITS = ("train", "val", "test")
SCORED = ("val", "test", INDEPENDENT_TEST)  # scored when the file exists (the independent test is optional)


@dataclass(frozen=True)
class OperatorCue:
    """``label = rule[first operator]``, fitted on ``count`` training examples."""

    rule: dict[str, int]
    count: int

    def predict(self, source: str) -> int:
        return self.rule[first_operator(source)]


def first_operator(source: str) -> str:
    """The root operator of a ListOps source (its first operator token)."""
    for token in source.split():
        if token in OPERATORS:
            return token
    raise ValueError(f"no ListOps operator in source {source[:80]!r}")


def read_examples(path: Path) -> list[tuple[str, int]]:
    """``(source, label)`` pairs of an official ``Source<TAB>Target`` file."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run 'python -m lra.tasks.listops generate --out {path.parent}'")
    lines = path.read_text().splitlines()[1:]
    return [(source, int(label)) for source, label in (line.split("\t") for line in lines if line)]


def fit(examples: list[tuple[str, int]]) -> OperatorCue:
    """The most frequent label per first operator (ties: the smallest label), as training records it:
    :func:`lra.tasks.first_operator.first_operator_rule`."""
    rule = first_operator_rule([first_operator(source) for source, _ in examples], [label for _, label in examples])
    return OperatorCue(rule, len(examples))


def accuracy(cue: OperatorCue, examples: list[tuple[str, int]]) -> float:
    """Fraction of ``examples`` whose label the cue predicts."""
    return sum(cue.predict(source) == label for source, label in examples) / len(examples)


def balanced_accuracy(cue: OperatorCue, examples: list[tuple[str, int]]) -> float:
    """The cue's accuracy with the four operators weighted equally (their expected share in generated data)."""
    by_operator = {op: [ex for ex in examples if first_operator(ex[0]) == op] for op in OPERATORS}
    present = [accuracy(cue, chosen) for chosen in by_operator.values() if chosen]
    return sum(present) / len(present)


def split_accuracies(data_dir: Path) -> dict[str, float]:
    """The cue's accuracy (fit on train) on every split of ``data_dir`` in :data:`SCORED` that exists."""
    cue = fit(read_examples(data_dir / "basic_train.tsv"))
    paths = {split: data_dir / f"basic_{split}.tsv" for split in SCORED}
    return {split: accuracy(cue, read_examples(path)) for split, path in paths.items() if path.is_file()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Command line: ``python -m lra.analysis.listops_cue DIR``."""
    parser = argparse.ArgumentParser(prog="python -m lra.analysis.listops_cue", description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path, help="a folder with basic_{train,val,test}.tsv "
                        "(and basic_independent_test.tsv, scored too when present)")
    args = parser.parse_args(argv)
    splits = {split: read_examples(args.data_dir / f"basic_{split}.tsv") for split in SPLITS}
    independent = args.data_dir / f"basic_{INDEPENDENT_TEST}.tsv"
    if independent.is_file():
        splits[INDEPENDENT_TEST] = read_examples(independent)
    cue = fit(splits["train"])
    print("first-operator cue (fit on train): " + ", ".join(f"{op} -> {label}" for op, label in cue.rule.items()))
    scores = {}
    for split in (split for split in SCORED if split in splits):
        examples = splits[split]
        scores[split] = accuracy(cue, examples)
        mix = Counter(first_operator(source) for source, _ in examples)
        print(
            f"{split}: {100 * scores[split]:.2f} % of {len(examples)} "
            f"(operators equally weighted: {100 * balanced_accuracy(cue, examples):.2f} %; "
            + ", ".join(f"{op} {mix[op]}" for op in OPERATORS) + ")"
        )
    return scores


if __name__ == "__main__":
    main()
