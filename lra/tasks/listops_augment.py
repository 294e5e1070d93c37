"""Train-time ListOps augmentations (``task.augment``): rewrite a training tree into another with the same value.

Source: Miralles-González, Huertas-Tato, Martín, Camacho 2025, "On the locality bias and results in the Long Range
Arena" (arXiv 2501.14850), whose code (github.com/pablomiralles22/long-transformers) rewrites ListOps examples as
they are batched, in ``src/data_loaders/listops.py`` (``ListopsCollatorFn``; line numbers at commit ec33dc6):

* **collapse** (:class:`CollapseSubtrees`; ``__augment_close_nodes``, lines 185-223, the method ``__augment`` called
  from 2024-01-30, commit 633ea81, until commit 949a231, 2024-03-19). A chosen example is rewritten bottom up: each
  operator node, once its arguments are read, is replaced by its value with probability
  ``sigmoid(a + b·d)``, ``a = -8``, ``b = 0.5`` (commit 54a1d82; 633ea81 had ``sigmoid(d)``), where their ``d``
  counts 1 plus the open operators, this one included (root: 2). A node's decision is drawn whatever its parent
  then does. An example is chosen with probability ``augment`` (line 98), 0.6 in the one ListOps config that ran
  it (``configs/listops/gmlp.json`` at 54a1d82). Here depth counts the root as 1 (our generator's convention), so
  the same probabilities are ``sigmoid(-7.5 + 0.5·depth)``: 0.0009 at the root, 0.047 at depth 9, the deepest
  operator LRA's generator makes (max depth 10). Collapses are rare and mostly deep: examples get a little
  shorter and shallower, their label unchanged.
* **shuffle** (:class:`ShuffleArguments`; ``__augment``, lines 123-145, from 949a231 on): every operator's
  arguments (digits and whole subtrees) in a uniformly random order, all four operators being symmetric. This is
  what the published augmented runs used: ``augment: 1.0`` with this code in
  ``configs/listops/rotary_transformer_augment_nopretrain.json`` (added 2024-05-21, commit bdeb947).

Ours, in our words: a node's value is :data:`lra.tasks.listops_generator.APPLY`'s, the evaluator's (LRA's semantics, MED =
``int(median)``), so a collapsed example keeps its label; their collapse wrote ``sorted(x)[len(x) // 2]`` for MED,
the upper middle value, which differs from LRA's label for an even number of arguments. The rewrite of example
``i`` in epoch ``e`` of a run with seed ``s`` draws from its own stream seeded by ``(s, e, i)`` only
(:class:`AugmentedSplit`), so a resumed run, another worker count or another batch order draws the same
rewrite. Cost: one pass over an example's n tokens, O(n · depth) list copies (depth <= 10), in the train loader's
process or its workers (``task.datamodule.num_workers``): pure Python, so a fast GPU needs several workers.
"""

from __future__ import annotations

import abc
import hashlib
import math
import random

import torch

from lra.tasks.base import EpochDataset
from lra.tasks.listops_generator import APPLY
from lra.tasks.listops_vocab import OPERATORS, TOKEN_IDS
from lra.tasks.splits import TokenizedSplit

DIGIT_0, CLOSE, UNKNOWN = TOKEN_IDS["0"], TOKEN_IDS["X"], TOKEN_IDS["<unk>"]
OPERATOR_OF = {TOKEN_IDS[operator]: operator for operator in OPERATORS}


def malformed(ids: list[int]) -> ValueError:
    return ValueError(f"not one whole ListOps tree (token ids {ids[:20]}...): a ']' without an operator, an operator "
                      "left open, or several trees")


class ListOpsAugmentation(abc.ABC):
    """An example is rewritten with probability ``example_probability`` (one draw), by :meth:`rewrite`: one pass
    over its tokens with a stack of the operators open, O(n · depth) list copies."""

    def __init__(self, example_probability: float):
        if not 0.0 <= example_probability <= 1.0:
            raise ValueError(f"task.augmentations.<name>.example_probability must be in [0, 1], got {example_probability}")
        self.example_probability = example_probability

    def __call__(self, ids: list[int], rng: random.Random) -> list[int]:
        if rng.random() >= self.example_probability:
            return ids
        return self.rewrite(ids, rng)

    @abc.abstractmethod
    def rewrite(self, ids: list[int], rng: random.Random) -> list[int]:
        """The token ids of a tree of the same value as ``ids``'s."""

    def dataset(self, split: TokenizedSplit, seed: int, source: str) -> "AugmentedSplit":
        return AugmentedSplit(split, self, seed, source)


class CollapseSubtrees(ListOpsAugmentation):
    """Each operator node at ``depth`` (root 1) replaced by its value with probability
    ``sigmoid(intercept + slope · depth)``, decided bottom up, one draw per node (module docstring)."""

    def __init__(self, example_probability: float, intercept: float, slope: float):
        super().__init__(example_probability)
        self.intercept, self.slope = intercept, slope

    def probability(self, depth: int) -> float:
        return 1.0 / (1.0 + math.exp(-(self.intercept + self.slope * depth)))

    def rewrite(self, ids: list[int], rng: random.Random) -> list[int]:
        frames: list[tuple[int, list[int], list[int]]] = [(-1, [], [])]  # (operator id, its tokens, its argument values)
        for token in ids:
            if token in OPERATOR_OF:
                frames.append((token, [token], []))
            elif token == CLOSE:
                if len(frames) < 2:
                    raise malformed(ids)
                operator, tokens, values = frames.pop()
                value = APPLY[OPERATOR_OF[operator]](values)
                parent_tokens, parent_values = frames[-1][1], frames[-1][2]
                parent_values.append(value)
                if rng.random() < self.probability(len(frames)):  # len(frames) is now this node's depth
                    parent_tokens.append(DIGIT_0 + value)
                else:
                    tokens.append(CLOSE)
                    parent_tokens.extend(tokens)
            else:
                frames[-1][1].append(token)
                frames[-1][2].append(token - DIGIT_0)
        if len(frames) != 1 or len(frames[0][2]) != 1:
            raise malformed(ids)
        return frames[0][1]


class ShuffleArguments(ListOpsAugmentation):
    """Every operator's arguments in a uniformly random order, inner operators first (module docstring)."""

    def rewrite(self, ids: list[int], rng: random.Random) -> list[int]:
        frames: list[tuple[int, list[list[int]]]] = [(-1, [])]  # (operator id, its arguments' tokens)
        for token in ids:
            if token in OPERATOR_OF:
                frames.append((token, []))
            elif token == CLOSE:
                if len(frames) < 2:
                    raise malformed(ids)
                operator, arguments = frames.pop()
                rng.shuffle(arguments)
                tokens = [operator]
                for argument in arguments:
                    tokens += argument
                tokens.append(CLOSE)
                frames[-1][1].append(tokens)
            else:
                frames[-1][1].append([token])
        if len(frames) != 1 or len(frames[0][1]) != 1:
            raise malformed(ids)
        return frames[0][1][0]


def example_seed(seed: int, epoch: int, index: int) -> int:
    """A 64-bit seed from ``(seed, epoch, index)`` alone (hashed: neighbouring triples share no stream)."""
    return int.from_bytes(hashlib.sha256(f"listops-augment/{seed}/{epoch}/{index}".encode()).digest()[:8], "little")


class AugmentedSplit(EpochDataset):
    """The train split, example ``index`` rewritten by ``augmentation`` with the stream of ``(seed, epoch, index)``
    (:class:`lra.tasks.resume.EpochSampler` yields the ``(epoch, index)`` keys). An item is the split's
    ``(ids (L,), length, label)`` with the rewritten ids, padded to the same ``L``; a rewrite is never longer."""

    def __init__(self, split: TokenizedSplit, augmentation: ListOpsAugmentation, seed: int, source: str):
        check_whole_trees(split, source)
        self.split, self.augmentation, self.seed = split, augmentation, seed

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        epoch, index = key
        ids = self.split.ids[index]
        tokens = self.augmentation(ids[: int(self.split.lengths[index])].tolist(), random.Random(example_seed(self.seed, epoch, index)))
        rewritten = torch.zeros_like(ids)
        rewritten[: len(tokens)] = torch.as_tensor(tokens, dtype=ids.dtype)
        return rewritten, torch.tensor(len(tokens), dtype=self.split.lengths.dtype), self.split.labels[index]


def check_whole_trees(split: TokenizedSplit, source: str) -> None:
    """Every example is one whole tree as far as counting tells: no unknown token and as many ``]`` as operators
    (``task.max_length`` cuts longer examples, which leaves operators open). O(N·L), vectorised."""
    ids = split.ids.long()
    real = torch.arange(ids.shape[-1]) < split.lengths.unsqueeze(-1)
    operators = ((ids >= min(OPERATOR_OF)) & (ids <= max(OPERATOR_OF)) & real).sum(-1)
    unknown = ((ids == UNKNOWN) & real).any(-1)
    bad = torch.nonzero(unknown | (operators != ((ids == CLOSE) & real).sum(-1))).flatten()
    if len(bad):
        index = int(bad[0])
        raise ValueError(
            f"task.augment rewrites whole ListOps trees, but train example {index} (counted from 0) of {source} is not "
            f"one: {'it holds a token outside the ListOps vocabulary' if unknown[index] else 'an operator is left open'} "
            f"({len(bad)} such example(s)). Examples longer than task.max_length={ids.shape[-1]} are cut: raise it to the "
            "longest example, or train without task.augment"
        )
