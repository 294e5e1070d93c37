"""ListOps (Nangia & Bowman 2018; LRA release ``listops-1000``): generator, reader, DataModule.

Generator: the official ``listops.py`` procedure (docs/design.md §4 "ListOps"). Operators ``[MIN [MAX [MED [SM``
over digits 0-9, max depth 10, at most 10 arguments; below max depth a node is a leaf with
probability 0.75, otherwise an operator with ``randint(2, max_args)`` children. Length counts
values plus 2 per operator; trees are kept when ``min_length < length < max_length`` and unique.
**Decision:** the generator is seeded and the vocabulary order is fixed (the official split and
token ids are not reproducible).

Format: TSV with header ``Source\\tTarget``; tokenisation maps ``]`` to ``X`` and drops ``(``/``)``.

    python -m lra.tasks.listops generate --out data/listops --train 96000 --val 2000 --test 2000 --seed 0

``generate`` writes only into an empty or absent folder, or over the files it wrote itself with the same
settings (``generated.json``, :mod:`lra.tasks.generated`); any other file there makes it refuse, naming the file.

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
from collections.abc import Mapping
from pathlib import Path

import torch
from torch.utils.data import Dataset
from tqdm import tqdm

from lra.tasks.base import CachedDataModule, TokenizedSplit
from lra.tasks.files import atomic_write_text, file_fingerprint, record_line, transient_lock
from lra.tasks.generated import GenerationRefused, Manifest, digest, foreign_file
from lra.tasks.first_operator import FIRST_OPERATOR_CUE, first_operator_rule
from lra.tasks.listops_check import tree_value
from lra.tasks.listops_vocab import INDEPENDENT_TEST, OPERATORS, TOKEN_IDS, VOCAB

log = logging.getLogger(__name__)

END = "]"
LEAF_PROBABILITY = 0.75
HEADER = "Source\tTarget"
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


# An operator's value from its arguments' values: MIN, MAX, MED = int(median) (truncating), SM = sum mod 10.
APPLY = {
    "[MIN": min,
    "[MAX": max,
    "[MED": lambda values: int(statistics.median(values)),
    "[SM": lambda values: sum(values) % 10,
}


def evaluate(tree: object) -> int:
    """Value of a tree (:data:`APPLY` at each operator)."""
    if isinstance(tree, int):
        return tree
    operator, children = tree
    return APPLY[operator]([evaluate(child) for child in children])


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


GENERATOR = "python -m lra.tasks.listops generate"


def generate_command(out: Path | str, sizes: dict[str, int], seed: int, min_length: int = 500, max_length: int = 2000,
                     max_depth: int = 10, max_args: int = 10) -> str:
    """The command line that runs :func:`generate` with these settings."""
    return (f"{GENERATOR} --out {out} --train {sizes.get('train', 0)} --val {sizes.get('val', 0)} --test {sizes.get('test', 0)} "
            f"--independent-test {sizes.get(INDEPENDENT_TEST, 0)} --seed {seed} --min-length {min_length} "
            f"--max-length {max_length} --max-depth {max_depth} --max-args {max_args}")


def generate(
    out: Path, sizes: dict[str, int], seed: int, min_length: int = 500, max_length: int = 2000,
    max_depth: int = 10, max_args: int = 10,
) -> None:
    """Write ``out/basic_<split>.tsv`` for each split of ``sizes`` (in its order), examples unique across all
    splits, each of ``min_length < length < max_length``.

    Refuses (:class:`GenerationRefused`, before writing anything) when ``out`` holds a file that a generation with
    these settings did not write (:func:`lra.tasks.generated.foreign_file`). Each file is written whole or not at all
    (a temporary file renamed into place), its hash recorded in ``out/generated.json`` first, so a killed run never
    leaves a truncated split that looks complete, and the next run with the same settings takes over its folder."""
    out, sizes = Path(out), {split: int(count) for split, count in sizes.items()}
    settings = dict(sizes=sizes, seed=seed, min_length=min_length, max_length=max_length, max_depth=max_depth, max_args=max_args)
    recorded = {**settings, "sizes": [[split, count] for split, count in sizes.items()]}  # the split order matters too
    found = foreign_file(out, GENERATOR, recorded)
    if found is not None:
        raise GenerationRefused(out, *found, command=generate_command(out.with_name(out.name + "-generated"), **settings))
    out.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(out, GENERATOR, recorded)
    rng = random.Random(seed)
    seen: set[str] = set()
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
            name, text = f"basic_{split}.tsv", "\n".join([HEADER, *rows]) + "\n"
            text_digest = digest(text.encode())
            if not manifest.holds(name, text_digest):  # the same bytes already there keep their mtime (and caches)
                manifest.record(name, text_digest)
                atomic_write_text(out / name, text)


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


UNKNOWN_ID = TOKEN_IDS["<unk>"]
OPERATOR_IDS = frozenset(TOKEN_IDS[op] for op in OPERATORS)
assert max(OPERATOR_IDS) - min(OPERATOR_IDS) == len(OPERATORS) - 1, "the operators' ids must be consecutive"


def example_problem(ids: list[int], source: str) -> str | None:
    """What makes a tokenised source no ListOps expression (a token outside the vocabulary, no operator), or None.
    O(length): two scans at C speed, run once per example when the data is read."""
    if UNKNOWN_ID in ids:
        token = next(t for t in source.replace("]", "X").replace("(", " ").replace(")", " ").split() if t not in TOKEN_IDS)
        return f"{token!r} is not a ListOps token (the tokens: {' '.join(VOCAB[2:-1])} ] ( ))"
    if OPERATOR_IDS.isdisjoint(ids):
        return f"no operator ({', '.join(OPERATORS)})"
    return None


def read_tsv(path: Path) -> tuple[list[list[int]], list[int]]:
    """Parse an official ListOps TSV; a malformed or non-UTF-8 line, a token outside the vocabulary, a source
    without an operator (:func:`example_problem`), brackets that are not one tree or a target that is not the tree's
    value (:func:`lra.tasks.listops_check.tree_value`) raises with ``file:line``; blank lines are skipped and counted
    in a warning."""
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
                found = f"the target {fields[1]!r}" if len(fields) == 2 else repr(line[:80])  # the whole target
                raise ValueError(
                    f"{path}:{number}: expected 'Source<TAB>Target' with a target digit 0-9, found {found}; "
                    "regenerate the file with 'python -m lra.tasks.listops generate' or re-download the LRA release"
                )
            ids = tokenize(fields[0])
            problem = example_problem(ids, fields[0])
            value = tree_value(ids) if problem is None else None
            if problem or isinstance(value, str):
                raise ValueError(f"{path}:{number}: not a ListOps example: {problem or value}, found {line[:80]!r}; "
                                 "the file is not ListOps data: regenerate it with 'python -m lra.tasks.listops "
                                 "generate' or re-download the LRA release (see data/README.md)")
            if value != int(fields[1]):
                raise ValueError(f"{path}:{number}: the target {fields[1].strip()} is not the value of its expression "
                                 f"({value}): the file is damaged or its labels are not ListOps': regenerate it with "
                                 "'python -m lra.tasks.listops generate' or re-download the LRA release")
            sequences.append(ids)
            labels.append(int(fields[1]))
    if blank:
        log.warning("%s: skipped %d blank line(s) (line %s)", path, len(blank), ", ".join(map(str, blank[:10])) +
                    (", ..." if len(blank) > 10 else ""))
    return sequences, labels


class ListOpsDataModule(CachedDataModule):
    """ListOps from ``data_dir/basic_{train,val,test}.tsv``.

    ``generate`` (settings of :func:`generate`, and ``default_dir``, the task's own folder) creates the files when
    they are missing: into ``default_dir`` silently, into any other ``data_dir`` (a user's path) after a one-line
    note, and never over a file it did not write (:class:`GenerationRefused` becomes an error naming ``data_dir``).
    ``augment`` names one of ``augmentations`` (:mod:`lra.tasks.listops_augment`), applied to the train split only."""

    task_name = "listops"
    shortcut = FIRST_OPERATOR_CUE
    num_classes, vocab_size = 10, len(VOCAB)

    def __init__(self, *args, generate: dict | None = None, augment: str | None = None, augmentations: dict | None = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.generate_settings = dict(generate) if generate else None
        augmentations = dict(augmentations or {})
        if augment is not None and augment not in augmentations:
            raise ValueError(f"task.augment={augment!r} is not a ListOps augmentation: expected null or one of "
                             f"{', '.join(sorted(augmentations))} (the keys of task.augmentations)")
        self.augmentation = augmentations[augment] if augment is not None else None

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

    def first_bad_task_example(self, data: TokenizedSplit) -> tuple[int, str] | None:
        """The first example holding ``<unk>`` or no operator (a cache built before :func:`read_tsv` checked each
        line), :data:`ROWS_PER_CHUNK` rows at a time."""
        first, last = min(OPERATOR_IDS), max(OPERATOR_IDS)  # the operators' ids are consecutive (VOCAB)
        for start in range(0, len(data), ROWS_PER_CHUNK):
            chunk = data.ids[start : start + ROWS_PER_CHUNK]
            unknown = torch.zeros(len(chunk), dtype=torch.bool)
            if bool((chunk == UNKNOWN_ID).any()):
                unknown = (chunk == UNKNOWN_ID).any(1)
            no_operator = (chunk[:, 0] < first) | (chunk[:, 0] > last)  # an expression starts with its root operator;
            if bool(no_operator.any()):  # where not (rare), one is looked for in the whole row
                no_operator &= ~((chunk >= first) & (chunk <= last)).any(1)
            if bool((unknown | no_operator).any()):
                index = int((unknown | no_operator).nonzero()[0])
                return start + index, "a token that is not ListOps'" if unknown[index] else "no operator"
        return None

    def example_source(self, split: str, index: int) -> str:
        path = Path(self.split_source(split))
        return f"{path}:{record_line(path, index, header_lines=1)}"

    def missing(self) -> list[str]:
        return [str(path) for path in self.paths().values() if not path.exists()]

    def check_data(self) -> None:
        if not self.missing():
            return
        if self.generate_settings is None:
            raise FileNotFoundError(
                f"ListOps data not found: {', '.join(self.missing())}. Download the LRA release into data/ "
                "(scripts/download_lra.sh, see data/README.md) or generate it with "
                f"'python -m lra.tasks.listops generate --out {self.data_dir}', or point task.data_dir at your copy."
            )
        settings = dict(self.generate_settings)
        default_dir, sizes = settings.pop("default_dir", None), settings.pop("sizes")
        fresh = not self.data_dir.exists() or (self.data_dir.is_dir() and not any(self.data_dir.iterdir()))
        if fresh and (default_dir is None or self.data_dir.resolve() != Path(default_dir).resolve()):
            state = "is empty" if self.data_dir.exists() else "does not exist"
            print(f"[lra] note: task.data_dir={self.data_dir} {state}: generating a synthetic ListOps set there "
                  f"({', '.join(f'{split} {count}' for split, count in sizes.items())}; seed {settings.get('seed')})", flush=True)
        # parallel runs on a fresh clone: one generates, the others wait and then find the files; the lock file
        # beside the data dir (which must be empty or absent to generate into) is removed when done
        with transient_lock(self.data_dir.parent / f".{self.data_dir.name}.generate.lock", f"generating {self.data_dir}"):
            if self.missing():
                try:
                    generate(self.data_dir, sizes, **settings)
                except GenerationRefused as refused:
                    raise FileExistsError(
                        f"ListOps data in task.data_dir={self.data_dir} is incomplete ({', '.join(Path(m).name for m in self.missing())} "
                        f"missing), and generating it would overwrite {refused.name}, {refused.why}; nothing was written. "
                        "To train on your own data, add the missing file(s) there. To train on a generated set, point "
                        f"task.data_dir at an empty or absent folder, or generate one ('{refused.command}') and point "
                        "task.data_dir at it"
                    ) from None

    def train_dataset(self) -> Dataset:
        """The train split, rewritten per ``(seed, epoch, index)`` when ``task.augment`` names an augmentation."""
        if self.augmentation is None:
            return super().train_dataset()
        return self.augmentation.dataset(self.splits["train"], self.shuffle_seed, self.split_source("train"))

    def read_split(self, split: str) -> TokenizedSplit:
        """The split's examples (each checked: :func:`read_tsv`), cut to ``task.max_length`` tokens; a note names
        how many are longer and the first of them (a cut expression may no longer determine its label)."""
        path = Path(self.split_source(split))
        sequences, labels = read_tsv(path)
        longer = [index for index, ids in enumerate(sequences) if len(ids) > self.max_length]
        if longer:
            print(f"[lra] note: {len(longer)} of {len(sequences)} examples of {path} are longer than task.max_length="
                  f"{self.max_length} tokens and are cut to it (the first: line {record_line(path, longer[0], 1)}, "
                  f"{len(sequences[longer[0]])} tokens)", flush=True)
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
    try:
        generate(
            args.out, sizes, seed=args.seed,
            min_length=args.min_length, max_length=args.max_length, max_depth=args.max_depth, max_args=args.max_args,
        )
    except GenerationRefused as refused:
        parser.exit(1, f"{parser.prog}: {refused}\n")


if __name__ == "__main__":
    main()
