"""ListOps (Nangia & Bowman 2018; LRA release ``listops-1000``): generator, reader, DataModule.

Generator: the official ``listops.py`` procedure (docs/design.md §4 "ListOps"). Operators ``[MIN [MAX [MED [SM``
over digits 0-9, max depth 10, at most 10 arguments; below max depth a node is a leaf with
probability 0.75, otherwise an operator with ``randint(2, max_args)`` children. Length counts
values plus 2 per operator; trees are kept when ``min_length < length < max_length`` and unique.
**Decision:** the generator is seeded and the vocabulary order is fixed (the official split and
token ids are not reproducible).

Format: TSV with header ``Source\\tTarget``; tokenisation maps ``]`` to ``X`` and drops ``(``/``)``.

    python -m lra.tasks.listops generate --out data/listops --train 96000 --val 2000 --test 2000 --seed 0

Full-size generation also writes ``basic_independent_test.tsv`` (20,000 examples by default,
``--independent-test 0`` to skip): drawn after the three official splits from the same seeded
stream, so it is disjoint from all of them and leaves them unchanged. Training tests the best
checkpoint on it after the test split when the file is present (``independent_test_acc``).
    python -m lra.analysis.listops_cue data/listops   # accuracy of the first-operator shortcut

The shortcut travels with every run: :func:`first_operator_cue` (the most frequent training label of each root
operator) is scored on each evaluated split and recorded in ``results.json`` (``shortcut_<split>_acc``).
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from lra.tasks.base import CachedDataModule, TokenizedSplit
from lra.tasks.files import atomic_write_text, file_fingerprint, locked

log = logging.getLogger(__name__)

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
LEAF_PROBABILITY = 0.75
# Fixed vocabulary: 0 = pad, 1 = unknown, then digits, operators and the closing token.
VOCAB = ("<pad>", "<unk>", *map(str, range(10)), *OPERATORS, "X")
TOKEN_IDS = {token: i for i, token in enumerate(VOCAB)}
HEADER = "Source\tTarget"
FIRST_OPERATOR_CUE = "first-operator cue: the most frequent training label of the root operator"
ROWS_PER_CHUNK = 4096  # rows scanned at once for their first operator token (bounds the (rows, L) mask)


def generate_tree(rng: random.Random, depth: int, max_depth: int, max_args: int) -> tuple[object, int]:
    """Return ``(tree, length)``; a tree is a digit or ``(operator, [children])``."""
    if depth < max_depth and rng.random() < 1 - LEAF_PROBABILITY:
        children, length = [], 2
        for _ in range(rng.randint(2, max_args)):
            child, child_length = generate_tree(rng, depth + 1, max_depth, max_args)
            children.append(child)
            length += child_length
        return (rng.choice(OPERATORS), children), length
    return rng.randrange(10), 1


def evaluate(tree: object) -> int:
    """Value of a tree: MIN, MAX, MED = int(median) (truncating), SM = sum mod 10."""
    if isinstance(tree, int):
        return tree
    operator, children = tree
    values = [evaluate(child) for child in children]
    if operator == "[MIN":
        return min(values)
    if operator == "[MAX":
        return max(values)
    if operator == "[MED":
        return int(statistics.median(values))
    return sum(values) % 10


def to_string(tree: object) -> str:
    """The official bracketing: ``( ( ( [MAX 2 ) 9 ) ] )`` for ``[MAX 2 9 ]``."""
    if isinstance(tree, int):
        return str(tree)
    operator, children = tree
    text = operator
    for child in children:
        text = f"( {text} {to_string(child)} )"
    return f"( {text} ] )"


def tokenize(source: str) -> list[int]:
    """Source string -> token ids with the fixed vocabulary (``]`` -> ``X``, parentheses dropped)."""
    tokens = source.replace("]", "X").replace("(", " ").replace(")", " ").split()
    return [TOKEN_IDS.get(token, TOKEN_IDS["<unk>"]) for token in tokens]


INDEPENDENT_TEST = "independent_test"


def generate(
    out: Path, sizes: dict[str, int], seed: int, min_length: int = 500, max_length: int = 2000,
    max_depth: int = 10, max_args: int = 10,
) -> None:
    """Write ``out/basic_<split>.tsv`` for each split of ``sizes`` (in its order), examples unique across all
    splits, each of ``min_length < length < max_length``.

    Each file is written whole or not at all (a temporary file renamed into place), so a killed run
    never leaves a truncated split that looks complete."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out.mkdir(parents=True, exist_ok=True)
    with tqdm(total=sum(sizes.values()), desc=f"ListOps -> {out}", unit="ex") as progress:
        for split, count in sizes.items():
            rows = []
            while len(rows) < count:
                tree, length = generate_tree(rng, 1, max_depth, max_args)
                if not min_length < length < max_length:
                    continue
                source = to_string(tree)
                if source in seen:
                    continue
                seen.add(source)
                rows.append(f"{source}\t{evaluate(tree)}")
                progress.update()
            atomic_write_text(out / f"basic_{split}.tsv", "\n".join([HEADER, *rows]) + "\n")


def first_operator_rule(operators: Sequence[str], labels: Sequence[int]) -> dict[str, int]:
    """The first-operator cue fitted on ``(root operator, label)`` pairs: per operator its most frequent label
    (ties: the smallest; an operator never seen: 0). O(n)."""
    counts: dict[str, Counter] = {operator: Counter() for operator in OPERATORS}
    for operator, label in zip(operators, labels):
        counts[operator][int(label)] += 1
    return {op: min(c, key=lambda label: (-c[label], label)) if c else 0 for op, c in counts.items()}


def root_operators(ids: torch.Tensor) -> list[str]:
    """The first operator token of each row of token ids ``(N, L)`` (the tree's root), scanned
    :data:`ROWS_PER_CHUNK` rows at a time: O(N·L) time, O(ROWS_PER_CHUNK·L) memory."""
    operator_ids = torch.tensor([TOKEN_IDS[op] for op in OPERATORS], dtype=ids.dtype)
    names = []
    for chunk in ids.split(ROWS_PER_CHUNK):
        is_operator = torch.isin(chunk, operator_ids)
        if not bool(is_operator.any(dim=1).all()):
            raise ValueError(f"{int((~is_operator.any(dim=1)).sum())} ListOps example(s) hold no operator token")
        first = chunk.gather(1, is_operator.byte().argmax(dim=1, keepdim=True)).squeeze(1)
        names += [VOCAB[token] for token in first.tolist()]
    return names


def first_operator_cue(splits: Mapping[str, TokenizedSplit]) -> dict[str, float]:
    """Accuracy of the first-operator cue fitted on ``splits["train"]`` on every other split: what a model scores
    by reading the root operator alone (~36 % on generated LRA-length data, against ~17 % for the majority
    class). O(N·L) over all splits."""
    train = splits["train"]
    rule = first_operator_rule(root_operators(train.ids), train.labels.tolist())
    scores = {}
    for split, data in splits.items():
        if split != "train":
            predicted = torch.tensor([rule[op] for op in root_operators(data.ids)])
            scores[split] = float((predicted == data.labels).double().mean())
    return scores


def read_tsv(path: Path) -> tuple[list[list[int]], list[int]]:
    """Parse an official ListOps TSV; a malformed or non-UTF-8 line raises with ``file:line``; blank lines are
    skipped and counted in a warning."""
    sequences, labels, blank = [], [], []
    if path.stat().st_size == 0:
        raise ValueError(f"{path}:1: expected the header 'Source<TAB>Target', found an empty file")
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                raise ValueError(f"{path}:{number}: not UTF-8 text (byte {raw[error.start:error.start + 1]!r} at column "
                                 f"{error.start + 1}): the file is damaged or not a ListOps TSV; regenerate it with "
                                 "'python -m lra.tasks.listops generate' or re-download the LRA release") from None
            if number == 1:
                if line.split("\t") != ["Source", "Target"]:
                    raise ValueError(f"{path}:1: expected the header 'Source<TAB>Target', found {line[:60]!r}")
                continue
            if not line.strip():
                blank.append(number)
                continue
            fields = line.split("\t")
            if len(fields) != 2 or not fields[1].strip().isdigit() or not 0 <= int(fields[1]) <= 9:
                raise ValueError(
                    f"{path}:{number}: expected 'Source<TAB>Target' with a target digit 0-9, found {line[:80]!r}; "
                    "regenerate the file with 'python -m lra.tasks.listops generate' or re-download the LRA release"
                )
            sequences.append(tokenize(fields[0]))
            labels.append(int(fields[1]))
    if blank:
        log.warning("%s: skipped %d blank line(s) (line %s)", path, len(blank), ", ".join(map(str, blank[:10])) +
                    (", ..." if len(blank) > 10 else ""))
    return sequences, labels


class ListOpsDataModule(CachedDataModule):
    """ListOps from ``data_dir/basic_{train,val,test}.tsv``; ``generate`` creates missing data first."""

    task_name = "listops"
    shortcut = FIRST_OPERATOR_CUE

    def __init__(self, *args, generate: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.generate_settings = dict(generate) if generate else None

    def paths(self) -> dict[str, Path]:
        return {split: self.data_dir / f"basic_{split}.tsv" for split in ("train", "val", "test")}

    def extra_test_splits(self) -> list[str]:
        """The 20,000-example independent test when ``data_dir`` holds it (``generate`` writes it)."""
        return [INDEPENDENT_TEST] if self.independent_test_path().exists() else []

    def independent_test_path(self) -> Path:
        return self.data_dir / f"basic_{INDEPENDENT_TEST}.tsv"

    def cache_settings(self) -> dict:
        files = {split: file_fingerprint(path) for split, path in self.paths().items()}
        if self.extra_test_splits():
            files[INDEPENDENT_TEST] = file_fingerprint(self.independent_test_path())
        return {**super().cache_settings(), "vocab": list(VOCAB), "files": files}

    def split_source(self, split: str) -> str:
        return str({**self.paths(), INDEPENDENT_TEST: self.independent_test_path()}[split])

    def missing(self) -> list[str]:
        return [str(path) for path in self.paths().values() if not path.exists()]

    def check_data(self) -> None:
        if not self.missing():
            return
        if self.generate_settings is not None:
            # parallel runs on a fresh clone: one generates, the others wait and then find the files
            with locked(self.data_dir.parent / f".{self.data_dir.name}.generate.lock", f"generating {self.data_dir}"):
                if self.missing():
                    settings = dict(self.generate_settings)
                    generate(self.data_dir, settings.pop("sizes"), **settings)
            return
        missing = self.missing()
        raise FileNotFoundError(
            f"ListOps data not found: {', '.join(missing)}. Download the LRA release into data/ "
            "(scripts/download_lra.sh, see data/README.md) or generate it with "
            f"'python -m lra.tasks.listops generate --out {self.data_dir}', or point task.data_dir at your copy."
        )

    def read_split(self, split: str) -> TokenizedSplit:
        sequences, labels = read_tsv(Path(self.split_source(split)))
        return TokenizedSplit.from_sequences(sequences, labels, self.max_length)

    def shortcut_accuracies(self) -> dict[str, float]:
        """The first-operator cue on every evaluated split (fitted on train): :func:`first_operator_cue`."""
        return first_operator_cue(self.splits)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lra.tasks.listops", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="write basic_{train,val,test,independent_test}.tsv in the official format")
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--train", type=int, default=96000)
    gen.add_argument("--val", type=int, default=2000)
    gen.add_argument("--test", type=int, default=2000)
    gen.add_argument("--independent-test", type=int, default=20000,
                     help="size of basic_independent_test.tsv, drawn after the other splits (0: not written)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--min-length", type=int, default=500)
    gen.add_argument("--max-length", type=int, default=2000)
    gen.add_argument("--max-depth", type=int, default=10)
    gen.add_argument("--max-args", type=int, default=10)
    commands.add_parser("cue", help="moved: python -m lra.analysis.listops_cue DIR", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "cue":
        parser.exit(2, "the cue probe moved: run 'python -m lra.analysis.listops_cue DIR'\n")
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    sizes = {"train": args.train, "val": args.val, "test": args.test}
    if args.independent_test > 0:
        sizes[INDEPENDENT_TEST] = args.independent_test
    generate(
        args.out, sizes, seed=args.seed,
        min_length=args.min_length, max_length=args.max_length, max_depth=args.max_depth, max_args=args.max_args,
    )


if __name__ == "__main__":
    main()
