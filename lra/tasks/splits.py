"""A task's examples as tensors: :class:`TokenizedSplit`, the check every task's data passes before training
(:func:`first_bad_example`) and the fingerprint a resumed run compares its data with (:func:`data_fingerprint`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

SPLITS = ("train", "val", "test")


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


def first_bad_example(data: TokenizedSplit, num_classes: int | None, vocab_size: int | None,
                      rows: int = 4096) -> tuple[int, str] | None:
    """``(index, what is wrong)`` of the first example with no tokens (a document of length 0), a label outside
    ``[0, num_classes)`` or a token id outside ``[0, vocab_size)``; None when every example is fine. Vectorised,
    ``rows`` examples at a time: O(N·L) time, O(rows·L) memory."""
    found = []
    lengths = data.lengths.view(len(data), -1)
    if bool((lengths < 1).any()):
        found.append((int((lengths < 1).any(1).nonzero()[0]), "it holds no tokens"))
    if num_classes is not None:
        outside = (data.labels < 0) | (data.labels >= num_classes)
        if bool(outside.any()):
            index = int(outside.nonzero()[0])
            found.append((index, f"label {int(data.labels[index])} outside 0..{num_classes - 1} (task.num_classes)"))
    if vocab_size is not None:
        for start in range(0, len(data), rows):
            chunk = data.ids[start : start + rows].reshape(min(rows, len(data) - start), -1)
            if int(chunk.min()) >= 0 and int(chunk.max()) < vocab_size:  # two reductions: the common case
                continue
            outside = ((chunk < 0) | (chunk >= vocab_size)).any(1)
            if bool(outside.any()):
                index = start + int(outside.nonzero()[0])
                token = data.ids[index].flatten()[((data.ids[index].flatten() < 0) | (data.ids[index].flatten() >= vocab_size))]
                found.append((index, f"token id {int(token[0])} outside 0..{vocab_size - 1} (task.vocab_size)"))
                break
    return min(found) if found else None


def data_fingerprint(splits: dict[str, TokenizedSplit]) -> str:
    """SHA-256 (hex) of the splits' tensors (ids, lengths, labels, in split-name order): the data a run trained on,
    whatever its files' names or times (a copy without its times has the same fingerprint, an edited line another).
    About 1 GB/s: a fraction of a second for full ListOps."""
    digest = hashlib.sha256()
    for name in sorted(splits):
        digest.update(name.encode())
        for tensor in (splits[name].ids, splits[name].lengths, splits[name].labels):
            digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
            digest.update(tensor.contiguous().numpy().data)
    return digest.hexdigest()
