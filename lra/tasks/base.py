"""What every task shares: tokenised splits, a settings-keyed cache, padding collation, resumable loaders.

A task subclasses :class:`CachedDataModule` and implements :meth:`read_split`, returning a
:class:`TokenizedSplit`. Splits are cached under ``<cache_dir>/<task>-<hash>/<split>.pt`` where the
hash covers every setting that changes the tensors, the source files' :func:`file_fingerprint`
included; the stored settings are compared on load, so a stale or corrupt cache is rebuilt, never
silently used. Processes that build the same cache at once (a parallel sweep on an empty cache)
take turns through a file lock, and each writes through its own temporary file that replaces the
cache atomically, so a reader sees a whole cache or none. A build that fails (a bad line in a data file)
removes its lock, and the cache folder when it made it and nothing else is in it.

``task.group_by_length=true`` batches training examples of similar lengths together (:func:`lra.tasks.resume.group_by_length`),
which on full ListOps brings the padded tokens of an epoch down to 0.56 of shuffled batches; evaluation keeps the files' order.
The lengths grouped are the split's own: a train set augmented per epoch (:class:`EpochDataset`, ListOps' ``task.augment``)
is grouped by its examples' lengths before the rewrite, which never lengthens them (shuffle keeps them, collapse shortens
a few); each batch is still cut to its longest rewritten example.
``task.pad_multiple`` rounds each batch's length up to a multiple of it (at most ``task.max_length``): a few batch
shapes (one with ``task.pad_multiple=${task.max_length}``), what CUDA graphs need (``model.compile=true`` on a GPU).

Training order is resumable (docs/design.md §4 "Caching": same seed -> same result, interrupted or not): the train
loader's order is a permutation derived from ``(seed, epoch)`` only (:class:`EpochSampler`,
seed = the run's ``seed``) and :class:`ResumableLoader` tells Lightning how far into the epoch it
is, which Lightning stores in the checkpoint and restores on resume, so the resumed epoch goes on
where it stopped. The random streams the training step draws from (dropout) are stored with the
datamodule's state and restored with it.
"""

from __future__ import annotations

import abc
import errno
import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from lra.tasks.files import atomic_write, building, disk_full, remove_partial_writes
from lra.tasks.resume import EpochSampler, ResumableLoader, rng_states, set_rng_states
from lra.tasks.splits import SPLITS, TokenizedSplit, first_bad_example

log = logging.getLogger(__name__)


class SplitDataset(Dataset):
    def __init__(self, split: TokenizedSplit):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.split.ids[index], self.split.lengths[index], self.split.labels[index]


class EpochDataset(Dataset):
    """A train dataset whose examples change from epoch to epoch (ListOps' ``task.augment``). It is indexed by
    ``(epoch, index)``, the keys :class:`EpochSampler` yields for it: an item depends on its key alone, so worker
    processes need no shared epoch counter and a resumed run gets the same items."""


def collate(items: list, pad_multiple: int | None = None) -> dict[str, torch.Tensor]:
    """Stack items, trim padding to the longest sequence of the batch (rounded up to a multiple of ``pad_multiple``
    when given, at most the stored length: a few batch shapes, or one), build the key mask."""
    ids, lengths, labels = (torch.stack(column) for column in zip(*items))
    longest = max(int(lengths.max()), 1)
    if pad_multiple is not None:
        longest = min(-(-longest // pad_multiple) * pad_multiple, ids.shape[-1])
    ids = ids[..., :longest].long()
    mask = torch.arange(longest) < lengths.unsqueeze(-1)
    return {"input_ids": ids, "mask": mask, "label": labels}


class CachedDataModule(L.LightningDataModule, abc.ABC):
    """Base DataModule: ``read_split(split)`` once, cache it, serve padded batches."""

    task_name: str = "task"
    shortcut: str | None = None  # the task's known shortcut, scored by shortcut_accuracies (None: none known)
    num_classes: int | None = None  # labels lie in [0, num_classes) (task.num_classes); None: not checked
    vocab_size: int | None = None  # token ids lie in [0, vocab_size) (task.vocab_size); None: not checked

    def __init__(self, data_dir: str, max_length: int, batch_size: int, cache_dir: str | None, num_workers: int = 0,
                 group_by_length: bool = False, pad_multiple: int | None = None):
        super().__init__()
        if pad_multiple is not None and (isinstance(pad_multiple, bool) or not isinstance(pad_multiple, int)
                                         or pad_multiple < 1):
            raise ValueError(f"task.pad_multiple must be null or an integer >= 1 (got {pad_multiple!r}); e.g. "
                             f"task.pad_multiple={max_length} pads every batch to task.max_length")
        self.pad_multiple = pad_multiple
        self.data_dir = Path(data_dir)
        self.max_length = max_length
        self.batch_size = batch_size
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.num_workers = num_workers
        self.group_by_length = group_by_length
        self.splits: dict[str, TokenizedSplit] = {}
        self.data_fingerprint: str | None = None  # of the loaded splits, set before training (lra.runtime.data_checks)
        self.resumed_fingerprint: str | None = None  # that a resumed checkpoint recorded

    # --- to implement per task -------------------------------------------------------------
    @abc.abstractmethod
    def read_split(self, split: str) -> TokenizedSplit:
        """Read one of ``train``/``val``/``test`` from ``data_dir`` and tokenise it."""

    def cache_settings(self) -> dict[str, Any]:
        """Everything that changes the cached tensors (extend in subclasses; source files by :func:`file_fingerprint`)."""
        return {"task": self.task_name, "max_length": self.max_length, "data_dir": str(self.data_dir.resolve())}

    def extra_test_splits(self) -> list[str]:
        """Test sets beyond ``test`` that ``data_dir`` holds, tested after it (ListOps' independent test); none here."""
        return []

    def test_splits(self) -> list[str]:
        """The splits ``trainer.test`` evaluates, in order: ``test``, then :meth:`extra_test_splits`."""
        return ["test", *self.extra_test_splits()]

    def check_data(self) -> None:
        """Raise a clear error (what is missing, how to get it) before anything is read."""

    def shortcut_accuracies(self) -> dict[str, float]:
        """``{split: accuracy}`` of :attr:`shortcut` on every split but train (the splits are loaded); none here."""
        return {}

    def shortcut_record(self) -> dict[str, Any]:
        """``results.json``'s ``shortcut`` (what it is) and ``shortcut_<split>_acc`` per evaluated split, so a report
        prints the level a model is read against without the data; {} for a task with no known shortcut."""
        if self.shortcut is None:
            return {}
        return {"shortcut": self.shortcut,
                **{f"shortcut_{split}_acc": accuracy for split, accuracy in self.shortcut_accuracies().items()}}

    def split_source(self, split: str) -> str:
        """Where ``split`` is read from, for error messages (override with the file's name)."""
        return str(self.data_dir)

    def first_bad_task_example(self, data: TokenizedSplit) -> tuple[int, str] | None:
        """``(index, what is wrong)`` of the first example this task cannot take beyond :func:`first_bad_example`'s
        checks (vectorised, O(N·L)), or None; none here."""
        return None

    def example_source(self, split: str, index: int) -> str:
        """Where example ``index`` of ``split`` was read, for error messages (override with ``file:line``)."""
        return f"{self.split_source(split)} (example {index + 1} of the {split} split)"

    def train_dataset(self) -> Dataset:
        """What the train loader draws from: the train split as it is (ListOps may augment it, an :class:`EpochDataset`)."""
        return SplitDataset(self.splits["train"])

    # --- shared machinery -------------------------------------------------------------------
    def cache_path(self, split: str) -> Path | None:
        if self.cache_dir is None:
            return None
        digest = hashlib.sha256(json.dumps(self.cache_settings(), sort_keys=True).encode()).hexdigest()[:16]
        return self.cache_dir / f"{self.task_name}-{digest}" / f"{split}.pt"

    def read_cache(self, path: Path, settings: dict) -> TokenizedSplit | None:
        """The cached split at ``path`` when it exists and was built with ``settings``, else None."""
        if not path.exists():
            return None
        try:
            stored = torch.load(path, weights_only=True)
            if stored["settings"] == json.loads(json.dumps(settings)):
                return TokenizedSplit(stored["ids"], stored["lengths"], stored["labels"])
            log.warning("cache %s was built with other settings; rebuilding", path)
        except Exception as error:  # a truncated or foreign file: rebuild it
            log.warning("cache %s is unreadable (%s); rebuilding", path, error)
        return None

    def load_split(self, split: str) -> TokenizedSplit:
        """``split`` from its cache, else read (and cached); one process builds a cache while the others wait."""
        self.check_data()
        settings = self.cache_settings()
        path = self.cache_path(split)
        if path is None:
            return self.checked(split, self.read_split(split))
        data = self.read_cache(path, settings)
        if data is None:  # a failed build leaves no lock-only cache folder behind (see building)
            with building(path, f"building the cache {path}"):
                data = self.read_cache(path, settings)  # built by the process we waited for
                if data is None:
                    remove_partial_writes(path.parent, path.name)  # of a build killed mid-write (we hold its lock)
                    data = self.checked(split, self.read_split(split))
                    payload = {"settings": settings, "ids": data.ids, "lengths": data.lengths, "labels": data.labels}
                    try:
                        atomic_write(path, lambda tmp: torch.save(payload, tmp))
                    except Exception as error:
                        if not disk_full(error):
                            raise
                        raise OSError(errno.ENOSPC, f"disk full while writing the data cache {path} (torch.save: "
                                      f"{str(error).splitlines()[0][:120]}): nothing of it was kept; free space "
                                      f"there, or cache on another disk with paths.cache_dir=<dir>") from error
        return self.checked(split, data)

    def checked(self, split: str, data: TokenizedSplit) -> TokenizedSplit:
        """``data``, unless it is empty (an empty split would train on nothing or report ``val_acc_best: -inf``) or
        holds an example the model cannot take (:func:`first_bad_example`): then the first one is named with where it
        was read (:meth:`example_source`), before any training step."""
        if len(data) == 0:
            raise ValueError(
                f"{self.task_name}: the {split} split is empty (no examples read from {self.split_source(split)}); "
                "the data is incomplete or truncated: re-download or regenerate it (see data/README.md), "
                "or point task.data_dir at a complete copy"
            )
        classes = torch.unique(data.labels)
        if split == "train" and len(classes) < 2:
            raise ValueError(
                f"{self.split_source(split)}: every one of the {len(data)} training examples has label "
                f"{int(classes[0])}: a classifier trained on one class learns nothing; a class of the data is missing "
                "(a folder or file not copied?): re-download or regenerate it (see data/README.md), or point "
                "task.data_dir at a complete copy")
        found = [first_bad_example(data, self.num_classes, self.vocab_size), self.first_bad_task_example(data)]
        bad = min((item for item in found if item is not None), default=None)
        if bad is not None:
            index, problem = bad
            raise ValueError(f"{self.example_source(split, index)}: not a {self.task_name} example: {problem}; the data "
                             "is damaged or not this task's: re-download or regenerate it (see data/README.md), or "
                             "point task.data_dir at the task's data")
        return data

    def prepare_data(self) -> None:
        """Build missing caches once (rank 0); without a cache ``setup`` reads the data, so nothing to do here."""
        if self.cache_dir is None:
            return
        for split in (*SPLITS, *self.extra_test_splits()):
            self.load_split(split)

    def setup(self, stage: str | None = None) -> None:
        for split in (*SPLITS, *self.extra_test_splits()):
            if split not in self.splits:
                self.splits[split] = self.load_split(split)

    @property
    def shuffle_seed(self) -> int:
        """The run's ``seed`` (``seed_everything`` exports it as ``PL_GLOBAL_SEED``); 0 outside a run."""
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        dataset = self.train_dataset() if split == "train" else SplitDataset(self.splits[split])
        # Own generator: worker seeds come from it, not from the global stream dropout draws from.
        options = dict(batch_size=self.batch_size, collate_fn=functools.partial(collate, pad_multiple=self.pad_multiple),
                       num_workers=self.num_workers,
                       persistent_workers=self.num_workers > 0, generator=torch.Generator().manual_seed(self.shuffle_seed))
        if not shuffle:
            return DataLoader(dataset, shuffle=False, **options)
        trainer = self.trainer
        replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        lengths = self.splits[split].lengths.view(len(dataset), -1).amax(1) if self.group_by_length else None
        sampler = EpochSampler(dataset, self.shuffle_seed, replicas, rank, lengths=lengths, batch_size=self.batch_size,
                               keyed_by_epoch=isinstance(dataset, EpochDataset))
        return ResumableLoader(dataset, sampler=sampler, **options)

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val", shuffle=False)

    def test_dataloader(self) -> list[DataLoader]:
        return [self.loader(split, shuffle=False) for split in self.test_splits()]

    # --- resume: Lightning stores this in checkpoints and gives it back on resume ----------------
    def state_dict(self) -> dict[str, Any]:
        """The random streams at checkpoint time, so a resumed run draws the same dropout masks as one that was
        never stopped (the train loader's position is saved by Lightning itself, see :class:`ResumableLoader`)."""
        return {"rng": rng_states(), **({"data_fingerprint": self.data_fingerprint} if self.data_fingerprint else {})}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The random streams, and the fingerprint of the data the checkpoint trained on (``resumed_fingerprint``:
        :class:`lra.runtime.data_checks.DataChecks` compares it with this data's before training)."""
        if "rng" in state_dict:
            set_rng_states(state_dict["rng"])
        self.resumed_fingerprint = state_dict.get("data_fingerprint")
