"""LRA Image: CIFAR-10 (Krizhevsky 2009) classified from its 1024 grayscale pixels as a sequence.

Pixels (docs/design.md §4 "Image"): ``uint8(round(0.2989 R + 0.5870 G + 0.1140 B))`` over 0-255 values, row-major
to 1024 tokens, ``id = pixel value`` (vocab 256). **Decision** (docs/design.md §4): pixel 0 is a real
token, so every image has length 1024 and the mask comes from lengths, never from ``ids != 0``.
**Decision:** the formula is computed exactly in integers, halves rounded up.

Splits: train = the first 90% of CIFAR-10 train (45k), val = the last 10% (5k), test = test (10k).
Sources (``source``): ``pickle`` reads the standard ``cifar-10-batches-py`` (``data_batch_1..5``,
``test_batch``); ``tfds`` reads TFDS ``cifar10`` (array_record); ``auto`` takes the pickles when
``data_dir`` exists, else TFDS when it is prepared. The pickles are read by :class:`BatchUnpickler`, which builds
only what the format holds (dicts, lists, bytes, numbers and uint8 numpy arrays), so a batch file cannot run code.
"""

from __future__ import annotations

import functools
import pickle
from pathlib import Path

import numpy as np

from lra.tasks.base import CachedDataModule
from lra.tasks.files import file_fingerprint
from lra.tasks.splits import TokenizedSplit
from lra.tasks.tfds_source import load_tfds, tfds_prepared

TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILES = ("test_batch",)
TRAIN_FRACTION = 0.9
WEIGHTS = (2989, 5870, 1140)  # 0.2989 R + 0.5870 G + 0.1140 B, in units of 1e-4


def grayscale(rgb: np.ndarray) -> np.ndarray:
    """uint8 ``(..., 3)`` RGB -> uint8 ``(...)`` ``round(0.2989 R + 0.5870 G + 0.1140 B)`` (halves up, exact)."""
    weighted = rgb.astype(np.int64) @ np.array(WEIGHTS, dtype=np.int64)
    return ((weighted + 5000) // 10000).astype(np.uint8)


# The globals a CIFAR-10 python batch names: numpy's array constructor (under numpy 1's module name in the released
# files, numpy 2's in a batch written today), the array class and the dtype. Nothing else is looked up.
RECONSTRUCT = np.zeros(0).__reduce__()[0]
BATCH_GLOBALS = {("numpy.core.multiarray", "_reconstruct"): RECONSTRUCT,
                 ("numpy._core.multiarray", "_reconstruct"): RECONSTRUCT,
                 ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}


class BatchUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only :data:`BATCH_GLOBALS`: any other name (a payload's ``os.system``)
    raises ``UnpicklingError`` when the unpickler meets it, before it is called."""

    def find_class(self, module: str, name: str):
        try:
            return BATCH_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which no CIFAR-10 batch holds (refused unloaded, as "
                                         f"unpickling it could run code)") from None


def read_pickles(root: Path, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Pixels uint8 ``(N, 1024)`` and labels ``(N,)`` of ``cifar-10-batches-py`` batch files, in file order."""
    pixels, labels = [], []
    for name in names:
        path = root / name
        try:
            with path.open("rb") as handle:
                batch = BatchUnpickler(handle, encoding="bytes").load()
            data = np.asarray(batch[b"data"], dtype=np.uint8)
            batch_labels = np.asarray(batch[b"labels"], dtype=np.int64)
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"{path} is not a CIFAR-10 python batch ({type(error).__name__}: {error}); re-download it with "
                "'python -m lra.data download cifar10' (see data/README.md)"
            ) from error
        if data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(batch_labels):
            raise ValueError(f"{path}: expected data (N, 3072) and N labels, found {data.shape} and {len(batch_labels)}")
        outside = np.flatnonzero((batch_labels < 0) | (batch_labels > 9))
        if len(outside):
            raise ValueError(f"{path}: image {outside[0] + 1} has label {batch_labels[outside[0]]}, outside CIFAR-10's 0..9; "
                             "re-download it with 'python -m lra.data download cifar10' (see data/README.md)")
        # rows hold the R, G, B planes of 32x32 pixels one after another
        pixels.append(grayscale(data.reshape(-1, 3, 1024).transpose(0, 2, 1)))
        labels.append(batch_labels)
    return np.concatenate(pixels), np.concatenate(labels)


def read_tfds(split: str, tfds_data_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Pixels uint8 ``(N, 1024)`` and labels of TFDS ``cifar10`` ``split``, in TFDS order."""
    examples = load_tfds("cifar10", split, tfds_data_dir)
    pixels = np.stack([grayscale(np.asarray(ex["image"], dtype=np.uint8)).reshape(-1) for ex in examples])
    return pixels, np.array([int(ex["label"]) for ex in examples], dtype=np.int64)


class ImageDataModule(CachedDataModule):
    """CIFAR-10 grayscale pixel sequences; val is the last 10% of train."""

    task_name = "image"
    num_classes, vocab_size = 10, 256

    def __init__(self, *args, source: str = "auto", tfds_data_dir: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if source not in ("auto", "pickle", "tfds"):
            raise ValueError(f"task.datamodule.source must be auto, pickle or tfds (got {source!r})")
        if self.max_length < 1024:
            raise ValueError(f"task.max_length={self.max_length} would cut CIFAR-10 images of 1024 pixels; set it to 1024")
        self.source = source
        self.tfds_data_dir = tfds_data_dir
        self.cifar: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    @functools.cached_property
    def resolved_source(self) -> str:
        """``source``; for ``auto`` the raw files when present, else TFDS when prepared, else the raw files
        (whose absence :meth:`check_data` reports with both ways to get the data)."""
        if self.source != "auto" or self.data_dir.is_dir():
            return "pickle" if self.source == "auto" else self.source
        return "tfds" if tfds_prepared("cifar10", self.tfds_data_dir) else "pickle"

    def cache_settings(self) -> dict:
        source = self.resolved_source
        settings = {**super().cache_settings(), "source": source, "weights": list(WEIGHTS), "train_fraction": TRAIN_FRACTION}
        if source == "pickle":
            settings["files"] = {name: file_fingerprint(self.data_dir / name) for name in TRAIN_FILES + TEST_FILES}
        else:
            settings["tfds_data_dir"] = self.tfds_data_dir
        return settings

    def split_source(self, split: str) -> str:
        if self.resolved_source == "tfds":
            return f"TFDS cifar10 {'test' if split == 'test' else 'train'} in {self.tfds_data_dir or 'the TFDS default directory'}"
        return ", ".join(str(self.data_dir / name) for name in (TEST_FILES if split == "test" else TRAIN_FILES))

    def check_data(self) -> None:
        if self.resolved_source == "tfds":
            return  # load_tfds raises with the fix when the dataset is not installed or prepared
        missing = [str(self.data_dir / name) for name in TRAIN_FILES + TEST_FILES if not (self.data_dir / name).exists()]
        if missing:
            raise FileNotFoundError(
                f"CIFAR-10 data not found: {', '.join(missing)}. Download it with 'python -m lra.data download cifar10' "
                "(unpacks cifar-10-batches-py under data/), or prepare TFDS cifar10 with "
                "'python -m lra.data download --tfds cifar10' and set task.datamodule.source=tfds, "
                "or point task.data_dir at your cifar-10-batches-py copy (see data/README.md)"
            )

    def cifar_split(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The source's ``train`` or ``test`` split, read once per DataModule."""
        if split not in self.cifar:
            if self.resolved_source == "pickle":
                self.cifar[split] = read_pickles(self.data_dir, TRAIN_FILES if split == "train" else TEST_FILES)
            else:
                self.cifar[split] = read_tfds(split, self.tfds_data_dir)
        return self.cifar[split]

    def read_split(self, split: str) -> TokenizedSplit:
        pixels, labels = self.cifar_split("test" if split == "test" else "train")
        if split != "test":
            cut = int(len(pixels) * TRAIN_FRACTION)
            pixels, labels = (pixels[:cut], labels[:cut]) if split == "train" else (pixels[cut:], labels[cut:])
        return TokenizedSplit.from_sequences(list(pixels.astype(np.int16)), labels.tolist(), self.max_length)
