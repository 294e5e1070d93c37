"""LRA Retrieval: do two ACL Anthology Network papers cite one another? (Radev et al. 2013; LRA release).

Files ``new_aan_pairs.{train,eval,test}.tsv`` (147086 / 18090 / 17437 pairs): tab-separated, no
header, no quoting, columns ``label id1 id2 text1 text2`` with the label written as a float
(``1.0``) and read as ``int(float(label))``. Each document is byte level (``id = byte + 1``,
0 = pad) truncated to ``max_length`` (4000). Items hold both documents: ids ``(N, 2, L)``; one
shared encoder encodes each and ``models.heads.PairHead`` classifies ``[a, b, a·b, a−b]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lra.tasks.base import CachedDataModule
from lra.tasks.files import file_fingerprint, record_line
from lra.tasks.splits import TokenizedSplit
from lra.tasks.text import BYTE_OFFSET, byte_ids

FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
COLUMNS = ("label", "id1", "id2", "text1", "text2")


def read_tsv(path: Path, max_length: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[int]]:
    """Byte ids of both documents and the labels of one AAN pairs file; a bad line raises with ``file:line``."""
    pairs, labels = [], []
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            fields = line.split(b"\t")
            if len(fields) != len(COLUMNS):
                raise ValueError(
                    f"{path}:{number}: expected {len(COLUMNS)} tab-separated columns ({' '.join(COLUMNS)}), "
                    f"found {len(fields)}; the file is damaged: re-download the LRA release "
                    "('python -m lra.data download lra_release', see data/README.md)"
                )
            try:
                value = float(fields[0])
            except ValueError:
                value = -1.0
            label = int(value) if value in (0.0, 1.0) else -1  # 0.5 is no label (int() would read it as 0)
            if label not in (0, 1):
                raise ValueError(
                    f"{path}:{number}: the label column must be 0 or 1 (as '0.0'/'1.0'), found {fields[0].decode(errors='replace')!r}; "
                    "re-download the LRA release (see data/README.md)"
                )
            if not fields[3].strip() or not fields[4].strip():
                raise ValueError(f"{path}:{number}: document {'text1' if not fields[3].strip() else 'text2'} is empty; "
                                 "the file is damaged: re-download the LRA release (see data/README.md)")
            pairs.append((byte_ids(fields[3], max_length), byte_ids(fields[4], max_length)))
            labels.append(label)
    return pairs, labels


class RetrievalDataModule(CachedDataModule):
    """AAN document pairs from ``data_dir/new_aan_pairs.{train,eval,test}.tsv`` (``eval`` is our ``val``)."""

    task_name = "retrieval"
    num_classes, vocab_size = 2, 256 + BYTE_OFFSET

    def example_source(self, split: str, index: int) -> str:
        path = self.paths()[split]
        return f"{path}:{record_line(path, index)}"

    def paths(self) -> dict[str, Path]:
        return {split: self.data_dir / name for split, name in FILES.items()}

    def cache_settings(self) -> dict:
        files = {split: file_fingerprint(path) for split, path in self.paths().items()}
        return {**super().cache_settings(), "byte_offset": BYTE_OFFSET, "files": files}

    def split_source(self, split: str) -> str:
        return str(self.paths()[split])

    def check_data(self) -> None:
        missing = [str(path) for path in self.paths().values() if not path.exists()]
        if missing:
            raise FileNotFoundError(
                f"Retrieval (AAN) data not found: {', '.join(missing)}. Download the LRA release with "
                "'python -m lra.data download lra_release' (unpacks lra_release/tsv_data under data/), "
                "or point task.data_dir at your tsv_data folder (see data/README.md)"
            )

    def read_split(self, split: str) -> TokenizedSplit:
        pairs, labels = read_tsv(self.paths()[split], self.max_length)
        return TokenizedSplit.from_sequences(pairs, labels, self.max_length)
