"""ListOps (Nangia & Bowman 2018; LRA release ``listops-1000``): reader, first-operator cue, DataModule.
The generator is :mod:`lra.tasks.listops_generator`; its command runs through this module:

    python -m lra.tasks.listops generate --out data/listops --train 96000 --val 2000 --test 2000 --seed 0

Format: TSV with header ``Source\\tTarget``; tokenisation maps ``]`` to ``X`` and drops ``(``/``)``. Training tests
the best checkpoint on ``basic_independent_test.tsv`` after the test split when the file is present
(``independent_test_acc``).

    python -m lra.analysis.listops_cue data/listops   # accuracy of the first-operator shortcut

The shortcut travels with every run: :func:`first_operator_cue` (the most frequent training label of each root
operator) is scored on each evaluated split and recorded in ``results.json`` (``shortcut_<split>_acc``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from torch.utils.data import Dataset

from lra.tasks.base import CachedDataModule
from lra.tasks.files import file_fingerprint, record_line, transient_lock
from lra.tasks.first_operator import FIRST_OPERATOR_CUE, first_operator_rule
from lra.tasks.generated import GenerationRefused
from lra.tasks.listops_check import tree_value
from lra.tasks.listops_generator import generate
from lra.tasks.listops_vocab import INDEPENDENT_TEST, OPERATORS, TOKEN_IDS, VOCAB
from lra.tasks.splits import TokenizedSplit

log = logging.getLogger(__name__)

ROWS_PER_CHUNK = 4096  # rows scanned at once for their first operator token (bounds the (rows, L) mask)


def tokenize(source: str) -> list[int]:
    """Source string -> token ids with the fixed vocabulary (``]`` -> ``X``, parentheses dropped)."""
    tokens = source.replace("]", "X").replace("(", " ").replace(")", " ").split()
    return [TOKEN_IDS.get(token, TOKEN_IDS["<unk>"]) for token in tokens]


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


if __name__ == "__main__":  # the command every generated folder records (listops_generator.GENERATOR)
    from lra.tasks.listops_generator import main

    main()
