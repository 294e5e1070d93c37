"""Resumable training order: a permutation derived from ``(seed, epoch)`` only, a loader that reports how
far into the epoch it is (Lightning stores that in checkpoints), and the random streams to restore."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed from ``(seed, epoch)``; unlike ``seed + epoch``, seed 3's second epoch is not seed 4's first."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{epoch}".encode()).digest()[:8], "little") >> 1


class EpochSampler(DistributedSampler):
    """Shuffled indices whose order depends only on ``(seed, epoch)``; this rank's share of them when
    ``num_replicas > 1`` (a ``DistributedSampler``, so Lightning keeps it under DDP). The first ``skip`` indices
    are left out (resuming mid-epoch). ``epoch`` is advanced by :class:`ResumableLoader`, not by Lightning's
    ``set_epoch``: after a resume from a checkpoint written at an epoch's last batch Lightning numbers the next
    epoch like the one that just ended, which would replay its order.

    With ``lengths`` (``(N,)`` real tokens per example) the shuffled order is regrouped by
    :func:`group_by_length` into global batches of ``batch_size × num_replicas`` similar lengths, so the
    collated batches, padded to their longest example, carry little padding.

    With ``keyed_by_epoch`` it yields ``(epoch, index)`` pairs instead of indices, for a dataset whose items
    depend on the epoch (:class:`lra.tasks.base.EpochDataset`)."""

    def __init__(self, dataset: Dataset, seed: int, num_replicas: int = 1, rank: int = 0,
                 lengths: torch.Tensor | None = None, batch_size: int = 1, keyed_by_epoch: bool = False):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
        self.skip = 0
        self.lengths = lengths
        self.batch_size = batch_size
        self.keyed_by_epoch = keyed_by_epoch

    def set_epoch(self, epoch: int) -> None:
        """Ignored (see the class docstring): the loader that owns this sampler counts the epochs."""

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch)))
        order = order.repeat(-(-self.total_size // len(order)))[: self.total_size]  # pad as DistributedSampler does
        if self.lengths is not None:
            generator = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch) ^ 1)
            order = group_by_length(order, self.lengths, self.batch_size * self.num_replicas, generator)
        indices = order[self.rank : self.total_size : self.num_replicas][self.skip :].tolist()
        return iter([(self.epoch, index) for index in indices] if self.keyed_by_epoch else indices)


def group_by_length(order: torch.Tensor, lengths: torch.Tensor, batch: int, generator: torch.Generator,
                    batches_per_group: int = 50) -> torch.Tensor:
    """``order`` (a shuffled index list) cut into groups of ``batches_per_group · batch`` consecutive indices,
    each group sorted by ``lengths`` (longest first) and cut into batches of ``batch``, the full batches of a
    group put in a random order (``generator``); a last short batch stays last, so every batch the loader
    cuts from the result is one of these. Which examples share a group is still the random shuffle; only
    who shares a batch inside it follows length (the megabatch scheme of Hugging Face's
    ``LengthGroupedSampler``, ``group_by_length=True``, 50 batches per group, whose batch order within a
    group we shuffle instead of starting with the longest). ``(M,)`` -> ``(M,)``, the same indices."""
    chunk = batches_per_group * batch
    pieces = []
    for start in range(0, len(order), chunk):
        group = order[start : start + chunk]
        group = group[torch.sort(lengths[group], descending=True, stable=True).indices]
        full = len(group) // batch * batch
        batches = group[:full].view(-1, batch)
        pieces += [batches[torch.randperm(len(batches), generator=generator)].flatten(), group[full:]]
    return torch.cat(pieces)


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
                "dataset_size": len(self.dataset), "batch_size": self.batch_size, "num_replicas": self.sampler.num_replicas,
                "group_by_length": self.sampler.lengths is not None}

    def load_state_dict(self, state: dict[str, int]) -> None:
        now = self.state_dict()
        state = {"group_by_length": False, **state}  # checkpoints from before task.group_by_length existed
        changed = [f"{key} {state.get(key)} -> {now[key]}"
                   for key in ("seed", "dataset_size", "batch_size", "num_replicas", "group_by_length")
                   if state.get(key) != now[key]]
        if changed:
            raise ValueError(
                f"cannot resume the training order: the checkpoint's train loader had other settings ({', '.join(changed)}; "
                "seed, task.batch_size, the train split, trainer.devices x num_nodes, task.group_by_length); resume with the settings "
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
