"""LRA Pathfinder and Path-X (Linsley et al. 2018): are the two markers joined by one path? Reader + DataModule.

Layout (the official release, and what ``lra.tasks.pathfinder_generator`` writes) under
``data_dir = .../pathfinder<resolution>/<difficulty>``::

    imgs/<batch>/sample_<i>.png     grayscale PNG, resolution x resolution
    metadata/<batch>.npy            named .npy but TEXT lines ``imgs/<batch> sample_<i>.png <i> <label> ...``
                                    (a real binary .npy string array with the same columns is accepted too)

Label 1 = connected. Tokens are the pixel values 0-255 in row-major order (``resolution²``
tokens; pixel 0 is a real token, docs/design.md §4). Empty (zero-byte) images are skipped and counted.
Split: a permutation seeded by ``seed`` over the listed non-empty images, 80% train / 10% val /
10% test (LRA publishes no split). LRA uses ``curv_contour_length_14``: 32 px for Pathfinder,
128 px (16384 tokens) for Path-X.

    python -m lra.tasks.pathfinder generate --out DIR --resolution 32 --difficulty 14 --count N --seed S --workers W
    python -m lra.analysis.pathfinder_cue DIR      # accuracy of the marker-distance shortcut
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from lra.tasks.base import CachedDataModule
from lra.tasks.files import file_fingerprint
from lra.tasks.splits import TokenizedSplit

log = logging.getLogger(__name__)

FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}
NPY_MAGIC = b"\x93NUMPY"


@dataclass(frozen=True)
class Listing:
    """The images the metadata lists: ``images[i]`` has ``labels[i]``; ``empty`` zero-byte images were skipped."""

    images: list[Path]
    labels: list[int]
    empty: int


def natural_key(path: Path) -> tuple:
    """``metadata/2.npy`` before ``metadata/10.npy``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name))


def metadata_rows(path: Path) -> list[list[str]]:
    """Whitespace-split rows of a metadata file: text lines, or a binary ``.npy`` array of strings."""
    raw = path.read_bytes()
    if not raw.startswith(NPY_MAGIC):
        return [line.split() for line in raw.decode("utf-8").splitlines()]
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as error:
        raise ValueError(f"{path}: binary .npy metadata must be a string array, not pickled objects ({error})") from error
    return [[item.decode() if isinstance(item, bytes) else str(item) for item in row] for row in np.atleast_2d(array)]


def metadata_files(root: Path) -> list[Path]:
    """``root/metadata/*.npy`` in natural order."""
    return sorted((root / "metadata").glob("*.npy"), key=natural_key)


def labelled_rows(root: Path) -> Iterator[tuple[Path, int, list[str]]]:
    """``(metadata file, line number, fields)`` of each non-empty metadata line; raises on one without a 0/1 label."""
    for path in metadata_files(root):
        for number, row in enumerate(metadata_rows(path), start=1):
            if not row:
                continue
            if len(row) < 4 or row[3] not in ("0", "1"):
                raise ValueError(
                    f"{path}:{number}: expected 'imgs/<batch> sample_<i>.png <index> <label 0|1> ...', "
                    f"found {' '.join(row)[:80]!r}; regenerate or re-download this difficulty (see data/README.md)"
                )
            yield path, number, row


def read_listing(root: Path) -> Listing:
    """All samples of ``root/metadata/*.npy`` in natural file order; raises on bad lines or missing images."""
    images, labels, empty = [], [], 0
    for path, number, row in labelled_rows(root):
        image = root / row[0] / row[1]
        if not image.is_file():
            raise FileNotFoundError(
                f"{path}:{number} lists {image}, which does not exist; the data is incomplete: "
                "re-download or regenerate it (see data/README.md)"
            )
        if image.stat().st_size == 0:
            empty += 1
            continue
        images.append(image)
        labels.append(int(row[3]))
    return Listing(images, labels, empty)


def split_indices(count: int, seed: int) -> dict[str, list[int]]:
    """A seeded permutation of ``range(count)`` cut 80 / 10 / 10 into train / val / test."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    n_train, n_val = int(count * FRACTIONS["train"]), int(count * FRACTIONS["val"])
    return {"train": order[:n_train], "val": order[n_train : n_train + n_val], "test": order[n_train + n_val :]}


def decode(path: Path, resolution: int) -> np.ndarray:
    """Pixels of one PNG as grayscale uint8 ``(resolution²,)``; an unreadable file raises naming ``path``."""
    try:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("L"))
    except (OSError, SyntaxError, ValueError) as error:
        raise ValueError(
            f"{path}: unreadable or corrupt PNG ({error}); regenerate or re-download the data, "
            "or delete the image and its metadata line"
        ) from error
    if pixels.shape != (resolution, resolution):
        raise ValueError(
            f"{path}: image is {pixels.shape[1]}x{pixels.shape[0]} px, expected {resolution}x{resolution} "
            "(task.resolution); point task.data_dir at the pathfinder<resolution> folder that matches"
        )
    return pixels.reshape(-1)


class PathfinderDataModule(CachedDataModule):
    """Pathfinder / Path-X images from the release layout, split 80/10/10 by ``seed``."""

    task_name = "pathfinder"
    num_classes, vocab_size = 2, 256

    def example_source(self, split: str, index: int) -> str:
        if self.listing is None:
            return super().example_source(split, index)
        return str(self.listing.images[split_indices(len(self.listing.images), self.seed)[split][index]])

    def __init__(self, *args, resolution: int = 32, seed: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        if self.max_length < resolution * resolution:
            raise ValueError(
                f"task.max_length={self.max_length} is shorter than the {resolution}x{resolution} = "
                f"{resolution * resolution} pixels of an image (task.resolution); set task.max_length={resolution * resolution}"
            )
        self.task_name = f"pathfinder{resolution}"
        self.resolution = resolution
        self.seed = seed
        self.listing: Listing | None = None

    def cache_settings(self) -> dict:
        """The metadata files by size and mtime, and each ``imgs/<batch>`` folder's mtime (an image added, removed
        or renamed there changes it). An image edited in place is not seen: that needs ``rm -r data/cache``."""
        metadata = metadata_files(self.data_dir)
        batches = sorted((self.data_dir / "imgs").glob("*"), key=natural_key)
        return {**super().cache_settings(), "resolution": self.resolution, "seed": self.seed, "fractions": FRACTIONS,
                "metadata": [[path.name, *file_fingerprint(path)] for path in metadata],
                "imgs": [[path.name, path.stat().st_mtime_ns] for path in batches]}

    def split_source(self, split: str) -> str:
        return f"{self.data_dir}/metadata/*.npy (split {split} is {FRACTIONS[split]:.0%} of the non-empty images listed)"

    def check_data(self) -> None:
        metadata = self.data_dir / "metadata"
        if metadata.is_dir() and any(metadata.glob("*.npy")):
            return
        raise FileNotFoundError(
            f"Pathfinder data not found: no {metadata}/*.npy. Download the LRA release with "
            "'python -m lra.data download lra_release', or generate it with 'python -m lra.tasks.pathfinder generate "
            f"--out {self.data_dir} --resolution {self.resolution} --difficulty 14 --count 200000 --workers 8' "
            "(difficulty = contour length: 6, 9 or 14), or point task.data_dir at your copy (see data/README.md)"
        )

    def read_split(self, split: str) -> TokenizedSplit:
        if self.listing is None:
            self.listing = read_listing(self.data_dir)
            if self.listing.empty:
                log.warning("%s: skipped %d empty images", self.data_dir, self.listing.empty)
        chosen = split_indices(len(self.listing.images), self.seed)[split]
        pixels = [
            decode(self.listing.images[i], self.resolution).astype(np.int16)
            for i in tqdm(chosen, desc=f"{self.task_name} {split}: decoding PNGs", unit="img", mininterval=2)
        ]
        return TokenizedSplit.from_sequences(pixels, [self.listing.labels[i] for i in chosen], self.max_length)


COMMANDS = {"generate": "lra.tasks.pathfinder_generator"}
MOVED = {"cue": "python -m lra.analysis.pathfinder_cue DIR"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lra.tasks.pathfinder", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command", choices=sorted({*COMMANDS, *MOVED}), help="generate: write images in the release layout",
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help="options of the command (generate --help)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command in MOVED:
        parser.exit(2, f"'{args.command}' moved: run '{MOVED[args.command]}'\n")
    importlib.import_module(COMMANDS[args.command]).main(args.args)


if __name__ == "__main__":
    main()
