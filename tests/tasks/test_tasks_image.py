"""LRA Image (CIFAR-10 grayscale): pickle and TFDS readers, the pixel formula, 90/10 split, errors."""

from __future__ import annotations

import os
import pickle
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy as np
import pytest

from lra.tasks.base import collate
from lra.tasks.image import ImageDataModule, grayscale, read_pickles

PER_BATCH = 4  # images per data_batch_<i> file: 20 train, 4 test


def reference_gray(r: int, g: int, b: int) -> int:
    """docs/design.md §4 "Image", exactly: round(0.2989 R + 0.5870 G + 0.1140 B), halves up."""
    value = Decimal("0.2989") * r + Decimal("0.5870") * g + Decimal("0.1140") * b
    return int(value.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def write_cifar(root: Path, seed: int = 0) -> dict[str, tuple[np.ndarray, list[int]]]:
    """``cifar-10-batches-py`` pickles at ``root``; returns the RGB images ``(N, 32, 32, 3)`` and labels per file."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        images = rng.integers(0, 256, (PER_BATCH, 32, 32, 3), dtype=np.uint8)
        images[0, :4, :4] = 0  # black pixels: real tokens with id 0
        labels = rng.integers(0, 10, PER_BATCH).tolist()
        rows = images.transpose(0, 3, 1, 2).reshape(PER_BATCH, 3072)  # R plane, G plane, B plane
        with (root / name).open("wb") as handle:
            pickle.dump({b"data": rows, b"labels": labels, b"batch_label": name.encode()}, handle)
        written[name] = (images, labels)
    return written


@pytest.fixture(scope="module")
def cifar(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("data") / "cifar-10-batches-py"
    return root, write_cifar(root)


def module(root: Path, **kwargs) -> ImageDataModule:
    return ImageDataModule(data_dir=str(root), max_length=1024, batch_size=4, cache_dir=None, **kwargs)


def test_grayscale_formula_on_known_pixels():
    pixels = np.array([[255, 255, 255], [0, 0, 0], [10, 20, 30], [1, 0, 0], [100, 50, 200], [0, 0, 250]], dtype=np.uint8)
    assert grayscale(pixels).tolist() == [reference_gray(*p) for p in pixels.tolist()] == [255, 0, 18, 0, 82, 29]  # 0.114 * 250 = 28.5 rounds up


def test_pickle_reader_gives_grayscale_pixels_and_the_90_10_split(cifar):
    root, written = cifar
    data = module(root)
    train, val, test = (data.load_split(split) for split in ("train", "val", "test"))
    images = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 6)])
    labels = sum((written[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    assert (len(train), len(val), len(test)) == (18, 2, PER_BATCH)
    for split, first in ((train, 0), (val, 18)):
        for i in range(len(split)):
            expected = [reference_gray(*p) for p in images[first + i].reshape(-1, 3).tolist()]
            assert split.ids[i].tolist() == expected
            assert int(split.labels[i]) == labels[first + i]
    expected = [reference_gray(*p) for p in written["test_batch"][0][1].reshape(-1, 3).tolist()]
    assert test.ids[1].tolist() == expected and test.labels.tolist() == written["test_batch"][1]


def test_black_pixels_are_real_tokens(cifar):
    train = module(cifar[0]).load_split("train")
    assert train.ids[0, :4].eq(0).all()
    assert train.lengths.eq(1024).all()
    batch = collate([(train.ids[i], train.lengths[i], train.labels[i]) for i in range(2)])
    assert batch["mask"].all() and batch["input_ids"].shape == (2, 1024)


def test_errors_name_the_file_and_the_fix(tmp_path, cifar):
    for source in ("pickle", "auto"):  # auto: no pickles and no prepared TFDS copy in tfds_data_dir
        data = module(tmp_path / "absent", source=source, tfds_data_dir=str(tmp_path / "tfds"))
        with pytest.raises(FileNotFoundError, match=r"data_batch_1.*download cifar10'.*--tfds cifar10"):
            data.load_split("train")
    root = tmp_path / "cifar"
    write_cifar(root)
    (root / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=rf"{root / 'test_batch'} is not a CIFAR-10 python batch"):
        module(root).load_split("test")
    with pytest.raises(ValueError, match="task.max_length=512"):
        ImageDataModule(data_dir=str(cifar[0]), max_length=512, batch_size=4, cache_dir=None)


class RunsACommand:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_batch_that_names_anything_but_arrays_is_refused_unloaded(tmp_path):
    root = tmp_path / "cifar"
    written = write_cifar(root)
    marker = tmp_path / "MARKER"
    images, labels = written["test_batch"]
    rows = images.transpose(0, 3, 1, 2).reshape(PER_BATCH, 3072)
    with (root / "test_batch").open("wb") as handle:
        pickle.dump({b"data": rows, b"labels": labels, b"note": RunsACommand(marker)}, handle)
    with pytest.raises(ValueError, match=rf"{root / 'test_batch'} is not a CIFAR-10 python batch \(UnpicklingError: it "
                                         rf"names posix.system, which no CIFAR-10 batch holds \(refused unloaded"):
        module(root).load_split("test")
    assert not marker.exists()
    # numpy 1's module name, as in the released batches (protocol 3 writes it as text): read as before
    legacy = pickle.dumps({b"data": rows, b"labels": labels}, protocol=3)
    assert b"numpy._core.multiarray\n" in legacy
    (root / "test_batch").write_bytes(legacy.replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n"))
    pixels, read_labels = read_pickles(root, ("test_batch",))
    assert read_labels.tolist() == labels and pixels[0, 0] == 0


@pytest.mark.slow
def test_tfds_source_reads_cifar10():
    tfds = pytest.importorskip("tensorflow_datasets", reason="pip install -r requirements-data.txt")
    with tfds.testing.mock_data(num_examples=10):
        reference = list(tfds.data_source("cifar10", split="train"))
        data = module(Path("/nonexistent"), source="tfds")
        train, val = data.load_split("train"), data.load_split("val")
    assert (len(train), len(val)) == (9, 1)
    for i, example in enumerate(reference):
        split, row = (train, i) if i < 9 else (val, i - 9)
        expected = [reference_gray(*p) for p in np.asarray(example["image"]).reshape(-1, 3).tolist()]
        assert split.ids[row].tolist() == expected and int(split.labels[row]) == int(example["label"])
