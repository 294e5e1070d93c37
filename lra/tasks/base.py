"""What every task shares: tokenised splits, a settings-keyed cache, padding collation, resumable loaders.

A task subclasses :class:`CachedDataModule` and implements :meth:`read_split`, returning a
:class:`TokenizedSplit`. Splits are cached under ``<cache_dir>/<task>-<hash>/<split>.pt`` where the
hash covers every setting that changes the tensors, the source files' :func:`file_fingerprint`
included; the stored settings are compared on load, so a stale or corrupt cache is rebuilt, never
silently used. Processes that build the same cache at once (a parallel sweep on an empty cache)
take turns through a file lock, and each writes through its own temporary file that replaces the
cache atomically, so a reader sees a whole cache or none.

Training order is resumable (DESIGN: same seed -> same result, interrupted or not): the train
loader's order is a permutation derived from ``(seed, epoch)`` only (:class:`EpochSampler`,
seed = the run's ``seed``) and :class:`ResumableLoader` tells Lightning how far into the epoch it
is, which Lightning stores in the checkpoint and restores on resume, so the resumed epoch goes on
where it stopped. The random streams the training step draws from (dropout) are stored with the
datamodule's state and restored with it.
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
import os
import random
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from filelock import FileLock, Timeout
from torch.utils.data import DataLoader, Dataset, DistributedSampler

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


# --- files: fingerprints, atomic writes, locks -------------------------------------------------------
def file_fingerprint(path: Path) -> list[int] | None:
    """``[size, mtime_ns]`` of ``path``, None when it is missing: part of a cache key, so a file edited in
    place (even to the same size) or replaced rebuilds the cache. **Decision:** mtime + size, not a content
    hash: hashing the multi-GB Pathfinder / AAN data on every start costs minutes; tools that copy a file
    with its old mtime *and* change its content (rare) need ``rm -r data/cache``."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return [stat.st_size, stat.st_mtime_ns]


def atomic_write(path: Path, write) -> None:
    """``write(tmp_path)`` into a temporary file unique to this call beside ``path``, then ``os.replace`` it onto
    ``path``: concurrent writers never share a temporary file and a reader sees the old or the new file, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def locked(path: Path, waiting_for: str) -> FileLock:
    """An acquired inter-process lock on ``path`` (released when the ``with`` block ends, or when the process
    dies: it is an ``fcntl`` lock); logs once if another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("waiting for another process %s (lock %s)", waiting_for, path)
        lock.acquire()
    return lock


# --- resumable training order ------------------------------------------------------------------------
def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed from ``(seed, epoch)``; unlike ``seed + epoch``, seed 3's second epoch is not seed 4's first."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{epoch}".encode()).digest()[:8], "little") >> 1


class EpochSampler(DistributedSampler):
    """Shuffled indices whose order depends only on ``(seed, epoch)``; this rank's share of them when
    ``num_replicas > 1`` (a ``DistributedSampler``, so Lightning keeps it under DDP). The first ``skip`` indices
    are left out (resuming mid-epoch). ``epoch`` is advanced by :class:`ResumableLoader`, not by Lightning's
    ``set_epoch``: after a resume from a checkpoint written at an epoch's last batch Lightning numbers the next
    epoch like the one that just ended, which would replay its order."""

    def __init__(self, dataset: Dataset, seed: int, num_replicas: int = 1, rank: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        """Ignored (see the class docstring): the loader that owns this sampler counts the epochs."""

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch)))
        order = order.repeat(-(-self.total_size // len(order)))[: self.total_size]  # pad as DistributedSampler does
        return iter(order[self.rank : self.total_size : self.num_replicas][self.skip :].tolist())


class ResumableLoader(DataLoader):
    """The train loader over an :class:`EpochSampler`. It counts the batches it hands out (``position``) and the
    epochs (a new iteration after a finished one starts the next epoch); ``state_dict()`` is that
    ``(epoch, position)``, which Lightning stores in every checkpoint (``loops.fit_loop.state_dict.combined_loader``)
    and gives back to ``load_state_dict`` on resume, so the run goes on with the next unseen batch, in the same
    order as a run that was never stopped."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.sampler, EpochSampler):
            raise TypeError(f"ResumableLoader needs an EpochSampler, got {type(self.sampler).__name__}")
        self.position = 0  # batches of the current epoch handed out

    def __iter__(self) -> Iterator:
        if self.position >= len(self):  # the previous epoch was finished
            self.sampler.epoch += 1
            self.position = 0
        self.sampler.skip = self.position * self.batch_size
        for batch in super().__iter__():
            self.position += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.sampler.epoch, "batches": self.position, "seed": self.sampler.seed,
                "dataset_size": len(self.dataset), "batch_size": self.batch_size, "num_replicas": self.sampler.num_replicas}

    def load_state_dict(self, state: dict[str, int]) -> None:
        now = self.state_dict()
        changed = [f"{key} {state[key]} -> {now[key]}" for key in ("seed", "dataset_size", "batch_size", "num_replicas")
                   if state.get(key) != now[key]]
        if changed:
            raise ValueError(
                f"cannot resume the training order: the checkpoint's train loader had other settings ({', '.join(changed)}; "
                "seed, task.batch_size, the train split, trainer.devices x num_nodes); resume with the settings "
                "of the interrupted run, or start a new run dir (hydra.run.dir=...) to train from scratch"
            )
        self.sampler.epoch, self.position = state["epoch"], state["batches"]


def rng_states() -> dict[str, Any]:
    """The global random streams (torch CPU and CUDA, numpy, python) that dropout and friends draw from, as
    tensors and plain lists (checkpoints are loaded with ``weights_only=True``, which refuses numpy arrays)."""
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    states = {"torch": torch.get_rng_state(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss],
              "python": [version, list(internal), gauss_next]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    kind, keys, position, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in states and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])


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
        """Everything that changes the cached tensors (extend in subclasses; source files by :func:`file_fingerprint`)."""
        return {"task": self.task_name, "max_length": self.max_length, "data_dir": str(self.data_dir.resolve())}

    def check_data(self) -> None:
        """Raise a clear error (what is missing, how to get it) before anything is read."""

    def split_source(self, split: str) -> str:
        """Where ``split`` is read from, for error messages (override with the file's name)."""
        return str(self.data_dir)

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
        if data is None:
            with locked(path.with_name(path.name + ".lock"), f"building the cache {path}"):
                data = self.read_cache(path, settings)  # built by the process we waited for
                if data is None:
                    data = self.checked(split, self.read_split(split))
                    payload = {"settings": settings, "ids": data.ids, "lengths": data.lengths, "labels": data.labels}
                    atomic_write(path, lambda tmp: torch.save(payload, tmp))
        return self.checked(split, data)

    def checked(self, split: str, data: TokenizedSplit) -> TokenizedSplit:
        """``data``, unless it is empty: an empty split would train on nothing or report ``val_acc_best: -inf``."""
        if len(data) == 0:
            raise ValueError(
                f"{self.task_name}: the {split} split is empty (no examples read from {self.split_source(split)}); "
                "the data is incomplete or truncated: re-download or regenerate it (see data/README.md), "
                "or point task.data_dir at a complete copy"
            )
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

    @property
    def shuffle_seed(self) -> int:
        """The run's ``seed`` (``seed_everything`` exports it as ``PL_GLOBAL_SEED``); 0 outside a run."""
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        dataset = SplitDataset(self.splits[split])
        # Own generator: worker seeds come from it, not from the global stream dropout draws from.
        options = dict(batch_size=self.batch_size, collate_fn=collate, num_workers=self.num_workers,
                       persistent_workers=self.num_workers > 0, generator=torch.Generator().manual_seed(self.shuffle_seed))
        if not shuffle:
            return DataLoader(dataset, shuffle=False, **options)
        trainer = self.trainer
        replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        return ResumableLoader(dataset, sampler=EpochSampler(dataset, self.shuffle_seed, replicas, rank), **options)

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.loader("test", shuffle=False)

    # --- resume: Lightning stores this in checkpoints and gives it back on resume ----------------
    def state_dict(self) -> dict[str, Any]:
        """The random streams at checkpoint time, so a resumed run draws the same dropout masks as one that was
        never stopped (the train loader's position is saved by Lightning itself, see :class:`ResumableLoader`)."""
        return {"rng": rng_states()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "rng" in state_dict:
            set_rng_states(state_dict["rng"])
