"""LRA Text: IMDB movie reviews (Maas et al. 2011) classified at byte level, positive = 1.

Tokens are the review's UTF-8 bytes, ``id = byte + 1`` (0 = pad), truncated to ``max_length``
(docs/design.md §3 "Per-task settings": 4000; LRA's own code used 1000). 25k train / 25k test reviews.

Sources (``source``): ``folder`` reads the standard ``aclImdb/{train,test}/{pos,neg}/*.txt``;
``tfds`` reads TFDS ``imdb_reviews`` prepared as array_record (see ``lra.tasks.tfds_source``);
``auto`` takes the folder when ``data_dir/train`` exists, else TFDS when it is prepared.

Splits: LRA validates on the IMDB test split; we keep that by default (``val == test``) for
comparability. ``val_split`` (a fraction) instead holds out a seeded random part of train.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np
import torch

from lra.tasks.base import CachedDataModule
from lra.tasks.files import file_fingerprint
from lra.tasks.splits import TokenizedSplit
from lra.tasks.tfds_source import load_tfds, tfds_prepared

BYTE_OFFSET = 1  # id = byte + 1, 0 = pad
LABELS = {"neg": 0, "pos": 1}


def byte_ids(text: bytes | str, max_length: int) -> np.ndarray:
    """UTF-8 bytes of ``text`` (first ``max_length``) as ids ``byte + 1``: int16 ``(min(len, max_length),)``."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return np.frombuffer(data[:max_length], dtype=np.uint8).astype(np.int16) + BYTE_OFFSET


def folder_files(root: Path, split: str) -> list[tuple[Path, int]]:
    """``(path, label)`` for ``root/<split>/{neg,pos}/*.txt``, negatives first, each folder sorted by name."""
    return [(path, label) for name, label in LABELS.items() for path in sorted((root / split / name).glob("*.txt"))]


def folder_fingerprint(files: list[tuple[Path, int]]) -> list[int]:
    """``[count, total bytes, digest of the names and mtimes]``: an added, removed, renamed or edited review
    (even one edited to the same size) changes it, so the cache is rebuilt."""
    digest, total = hashlib.sha256(), 0
    for path, _ in files:
        size, mtime = file_fingerprint(path)
        digest.update(f"{path.parent.name}/{path.name}\t{size}\t{mtime}\n".encode())
        total += size
    return [len(files), total, int(digest.hexdigest()[:15], 16)]


def read_folder(root: Path, split: str, max_length: int) -> tuple[list[np.ndarray], list[int]]:
    """Byte ids and labels of one ``aclImdb`` split (``train`` or ``test``)."""
    files = folder_files(root, split)
    if not files:
        raise FileNotFoundError(
            f"no reviews in {root / split}/{{neg,pos}}/*.txt: the aclImdb folder is incomplete; "
            "re-download it with 'python -m lra.data download imdb' (see data/README.md)"
        )
    docs = [byte_ids(path.read_bytes(), max_length) for path, _ in files]
    empty = next((path for (path, _), doc in zip(files, docs) if len(doc) == 0), None)
    if empty is not None:
        raise ValueError(f"{empty}: an empty review (0 bytes): the aclImdb copy is damaged; re-download it "
                         "('scripts/download_lra.sh imdb', see data/README.md)")
    return docs, [label for _, label in files]


def read_tfds(split: str, max_length: int, tfds_data_dir: str | None) -> tuple[list[np.ndarray], list[int]]:
    """Byte ids and labels of TFDS ``imdb_reviews`` ``split`` (``train`` or ``test``)."""
    examples = load_tfds("imdb_reviews", split, tfds_data_dir)
    docs, labels = [], []
    for example in examples:
        docs.append(byte_ids(example["text"], max_length))
        labels.append(int(example["label"]))
    return docs, labels


class TextDataModule(CachedDataModule):
    """IMDB at byte level; ``val`` is IMDB test unless ``val_split`` holds out part of train."""

    task_name = "text"
    num_classes, vocab_size = len(LABELS), 256 + BYTE_OFFSET

    def __init__(self, *args, source: str = "auto", val_split: float | None = None, seed: int = 0,
                 tfds_data_dir: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if source not in ("auto", "folder", "tfds"):
            raise ValueError(f"task.datamodule.source must be auto, folder or tfds (got {source!r})")
        if val_split is not None and not 0 < val_split < 1:
            raise ValueError(f"task.datamodule.val_split must be a fraction in (0, 1) or null (got {val_split})")
        self.source = source
        self.val_split = val_split
        self.seed = seed
        self.tfds_data_dir = tfds_data_dir
        self.imdb: dict[str, tuple[list[np.ndarray], list[int]]] = {}

    @functools.cached_property
    def resolved_source(self) -> str:
        """``source``; for ``auto`` the raw files when present, else TFDS when prepared, else the raw files
        (whose absence :meth:`check_data` reports with both ways to get the data)."""
        if self.source != "auto" or (self.data_dir / "train").is_dir():
            return "folder" if self.source == "auto" else self.source
        return "tfds" if tfds_prepared("imdb_reviews", self.tfds_data_dir) else "folder"

    def cache_settings(self) -> dict:
        source = self.resolved_source
        settings = {**super().cache_settings(), "source": source, "byte_offset": BYTE_OFFSET,
                    "val_split": self.val_split, "seed": self.seed if self.val_split else None}
        if source == "folder":
            settings["files"] = {split: folder_fingerprint(folder_files(self.data_dir, split)) for split in ("train", "test")}
        else:
            settings["tfds_data_dir"] = self.tfds_data_dir
        return settings

    def split_source(self, split: str) -> str:
        imdb_split = "test" if split == "test" or (split == "val" and self.val_split is None) else "train"
        if self.resolved_source == "tfds":
            return f"TFDS imdb_reviews {imdb_split} in {self.tfds_data_dir or 'the TFDS default directory'}"
        return f"{self.data_dir / imdb_split}/{{neg,pos}}/*.txt"

    def check_data(self) -> None:
        if self.resolved_source == "tfds":
            return  # load_tfds raises with the fix when the dataset is not installed or prepared
        missing = [str(self.data_dir / split) for split in ("train", "test") if not (self.data_dir / split).is_dir()]
        if missing:
            raise FileNotFoundError(
                f"IMDB data not found: {', '.join(missing)}. Download it with 'python -m lra.data download imdb' "
                "(unpacks aclImdb under data/), or prepare TFDS imdb_reviews with "
                "'python -m lra.data download --tfds imdb_reviews' and set task.datamodule.source=tfds, "
                "or point task.data_dir at your aclImdb copy (see data/README.md)"
            )

    def imdb_split(self, split: str) -> tuple[list[np.ndarray], list[int]]:
        """The source's ``train`` or ``test`` split, read once per DataModule."""
        if split not in self.imdb:
            if self.resolved_source == "folder":
                self.imdb[split] = read_folder(self.data_dir, split, self.max_length)
            else:
                self.imdb[split] = read_tfds(split, self.max_length, self.tfds_data_dir)
        return self.imdb[split]

    def read_split(self, split: str) -> TokenizedSplit:
        if split == "test" or (split == "val" and self.val_split is None):
            docs, labels = self.imdb_split("test")
        else:
            docs, labels = self.imdb_split("train")
            if self.val_split is not None:
                order = torch.randperm(len(docs), generator=torch.Generator().manual_seed(self.seed)).tolist()
                held_out = round(len(docs) * self.val_split)
                chosen = order[:held_out] if split == "val" else order[held_out:]
                docs, labels = [docs[i] for i in chosen], [labels[i] for i in chosen]
        return TokenizedSplit.from_sequences(docs, labels, self.max_length)
