"""What every task shares: tokenised splits, a settings-keyed cache, padding collation, loaders.

A task subclasses :class:`CachedDataModule` and implements :meth:`read_split`, returning a
:class:`TokenizedSplit`. Splits are cached under ``<cache_dir>/<task>-<hash>/<split>.pt`` where the
hash covers every setting that changes the tensors; the stored settings are compared on load, so a
stale or corrupt cache is rebuilt, never silently used.
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
PAD_ID = 0


@dataclass
class TokenizedSplit:
    """``ids`` int ``(N, [k,] L)`` padded with 0, ``lengths`` ``(N, [k])`` real tokens, ``labels`` ``(N,)``."""

    ids: torch.Tensor
    lengths: torch.Tensor
    labels: torch.Tensor

    @classmethod
    def from_sequences(cls, sequences: list, labels: list[int], max_length: int) -> "TokenizedSplit":
        """Pad (and truncate to ``max_length``) lists of id lists; an item may be a tuple of documents."""
        multi = bool(sequences) and isinstance(sequences[0], tuple)
        docs = [seq if multi else (seq,) for seq in sequences]
        k = len(docs[0]) if docs else 1
        ids = torch.zeros(len(docs), k, max_length, dtype=torch.int16)
        lengths = torch.zeros(len(docs), k, dtype=torch.int32)
        for i, item in enumerate(docs):
            for j, doc in enumerate(item):
                doc = doc[:max_length]
                ids[i, j, : len(doc)] = torch.as_tensor(doc, dtype=torch.int16)
                lengths[i, j] = len(doc)
        if not multi:
            ids, lengths = ids[:, 0], lengths[:, 0]
        return cls(ids, lengths, torch.as_tensor(labels, dtype=torch.long))

    def __len__(self) -> int:
        return len(self.labels)


class SplitDataset(Dataset):
    def __init__(self, split: TokenizedSplit):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.split.ids[index], self.split.lengths[index], self.split.labels[index]


def collate(items: list) -> dict[str, torch.Tensor]:
    """Stack items, trim padding to the longest sequence of the batch, build the key mask."""
    ids, lengths, labels = (torch.stack(column) for column in zip(*items))
    longest = max(int(lengths.max()), 1)
    ids = ids[..., :longest].long()
    mask = torch.arange(longest) < lengths.unsqueeze(-1)
    return {"input_ids": ids, "mask": mask, "label": labels}


class CachedDataModule(L.LightningDataModule, abc.ABC):
    """Base DataModule: ``read_split(split)`` once, cache it, serve padded batches."""

    task_name: str = "task"

    def __init__(self, data_dir: str, max_length: int, batch_size: int, cache_dir: str | None, num_workers: int = 0):
        super().__init__()
        self.data_dir = Path(data_dir)
        self.max_length = max_length
        self.batch_size = batch_size
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.num_workers = num_workers
        self.splits: dict[str, TokenizedSplit] = {}

    # --- to implement per task -------------------------------------------------------------
    @abc.abstractmethod
    def read_split(self, split: str) -> TokenizedSplit:
        """Read one of ``train``/``val``/``test`` from ``data_dir`` and tokenise it."""

    def cache_settings(self) -> dict[str, Any]:
        """Everything that changes the cached tensors (extend in subclasses)."""
        return {"task": self.task_name, "max_length": self.max_length, "data_dir": str(self.data_dir.resolve())}

    def check_data(self) -> None:
        """Raise a clear error (what is missing, how to get it) before anything is read."""

    # --- shared machinery -------------------------------------------------------------------
    def cache_path(self, split: str) -> Path | None:
        if self.cache_dir is None:
            return None
        digest = hashlib.sha256(json.dumps(self.cache_settings(), sort_keys=True).encode()).hexdigest()[:16]
        return self.cache_dir / f"{self.task_name}-{digest}" / f"{split}.pt"

    def load_split(self, split: str) -> TokenizedSplit:
        path = self.cache_path(split)
        settings = self.cache_settings()
        if path is not None and path.exists():
            try:
                stored = torch.load(path, weights_only=True)
                if stored["settings"] == json.loads(json.dumps(settings)):
                    return TokenizedSplit(stored["ids"], stored["lengths"], stored["labels"])
                log.warning("cache %s was built with other settings; rebuilding", path)
            except Exception as error:  # a truncated or foreign file: rebuild it
                log.warning("cache %s is unreadable (%s); rebuilding", path, error)
        self.check_data()
        data = self.read_split(split)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            torch.save(
                {"settings": settings, "ids": data.ids, "lengths": data.lengths, "labels": data.labels}, tmp
            )
            tmp.replace(path)
        return data

    def prepare_data(self) -> None:
        """Build missing caches once (rank 0); without a cache ``setup`` reads the data, so nothing to do here."""
        if self.cache_dir is None:
            return
        for split in SPLITS:
            self.load_split(split)

    def setup(self, stage: str | None = None) -> None:
        for split in SPLITS:
            if split not in self.splits:
                self.splits[split] = self.load_split(split)

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        return DataLoader(
            SplitDataset(self.splits[split]),
            batch_size=self.batch_size,
            shuffle=shuffle,
            collate_fn=collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.loader("test", shuffle=False)
