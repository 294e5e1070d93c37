"""Pathfinder / Path-X reader: release layout (text and binary .npy metadata), split, empty images, errors, cache."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lra.tasks.pathfinder import PathfinderDataModule, read_listing
from lra.tasks.pathfinder import main as pathfinder_cli


def write_pathfinder(root: Path, resolution: int = 32, count: int = 21, seed: int = 0) -> dict[str, tuple[np.ndarray, int]]:
    """Release layout at ``root``: ``imgs/{0,1}/sample_<i>.png``, ``metadata/0.npy`` as text lines and
    ``metadata/1.npy`` as a binary .npy string array; image 3 is an empty (zero-byte) file, image 0 all black.
    Returns ``{image path: (pixels (resolution²,), label)}`` of the non-empty images."""
    rng = np.random.default_rng(seed)
    written = {}
    rows: dict[int, list[list[str]]] = {0: [], 1: []}
    for i in range(count):
        batch = 0 if i < count // 2 else 1
        folder = root / "imgs" / str(batch)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (resolution, resolution), dtype=np.uint8) * (i != 0)
        label = i % 2
        path = folder / f"sample_{i}.png"
        if i == 3:
            path.write_bytes(b"")
        else:
            Image.fromarray(pixels.astype(np.uint8), mode="L").save(path)
            written[str(path)] = (pixels.reshape(-1), label)
        rows[batch].append([f"imgs/{batch}", f"sample_{i}.png", str(i), str(label), "1.0", "14", "4", "2", "0.5", "1", "1"])
    (root / "metadata").mkdir(parents=True, exist_ok=True)
    (root / "metadata" / "0.npy").write_text("".join(" ".join(row) + "\n" for row in rows[0]))
    with (root / "metadata" / "1.npy").open("wb") as handle:
        np.save(handle, np.array(rows[1]))
    return written


@pytest.fixture(scope="module")
def pathfinder(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("data") / "pathfinder32" / "curv_contour_length_14"
    return root, write_pathfinder(root)


def module(root: Path, resolution: int = 32, **kwargs) -> PathfinderDataModule:
    return PathfinderDataModule(data_dir=str(root), max_length=resolution * resolution, batch_size=4,
                                cache_dir=kwargs.pop("cache_dir", None), resolution=resolution, **kwargs)


def rows_of(split) -> set[tuple]:
    return {(tuple(split.ids[i].tolist()), int(split.labels[i])) for i in range(len(split))}


def test_reader_yields_pixels_labels_and_a_seeded_80_10_10_split(pathfinder, caplog):
    root, written = pathfinder
    with caplog.at_level(logging.WARNING, logger="lra.tasks.pathfinder"):
        data = module(root, seed=1)
        splits = {name: data.load_split(name) for name in ("train", "val", "test")}
    assert "skipped 1 empty images" in caplog.text
    assert [len(s) for s in splits.values()] == [16, 2, 2]  # 20 non-empty images
    expected = {(tuple(pixels.tolist()), label) for pixels, label in written.values()}
    union = set().union(*(rows_of(s) for s in splits.values()))
    assert union == expected and len(union) == 20
    assert all(s.lengths.eq(1024).all() for s in splits.values())  # all-black image 0 is 1024 real tokens
    assert splits["test"].ids.equal(module(root, seed=1).load_split("test").ids)
    assert not rows_of(module(root, seed=2).load_split("train")) == rows_of(splits["train"])


def test_listing_counts_empty_images_and_reads_binary_npy_metadata(pathfinder):
    root, written = pathfinder
    listing = read_listing(root)
    assert listing.empty == 1
    assert sorted(map(str, listing.images)) == sorted(written)
    assert {str(p): label for p, label in zip(listing.images, listing.labels)} == {p: v[1] for p, v in written.items()}
    assert any("imgs/1/" in str(p) for p in listing.images)  # from the binary .npy file


def test_a_corrupt_png_names_its_path(tmp_path):
    root = tmp_path / "pf"
    write_pathfinder(root, count=10)
    broken = root / "imgs" / "0" / "sample_2.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(ValueError, match=rf"{broken}: unreadable or corrupt PNG"):
        for split in ("train", "val", "test"):
            module(root).load_split(split)


def test_a_metadata_line_pointing_to_a_missing_image_names_file_and_line(tmp_path):
    root = tmp_path / "pf"
    write_pathfinder(root, count=10)
    (root / "imgs" / "0" / "sample_4.png").unlink()
    with pytest.raises(FileNotFoundError, match=rf"{root / 'metadata' / '0.npy'}:5 lists .*sample_4.png"):
        module(root).load_split("train")


def test_a_malformed_metadata_line_names_file_and_line(tmp_path):
    root = tmp_path / "pf"
    write_pathfinder(root, count=10)
    with (root / "metadata" / "0.npy").open("a") as handle:
        handle.write("imgs/0 sample_1.png 1 maybe\n")
    with pytest.raises(ValueError, match=r"0.npy:6: expected 'imgs/<batch> sample_<i>.png <index> <label 0\|1>"):
        module(root).load_split("train")


def test_missing_data_says_how_to_download_or_generate(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"python -m lra.data download lra_release.*python -m lra.tasks.pathfinder generate"):
        module(tmp_path / "absent").load_split("train")


def test_max_length_shorter_than_the_image_is_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"task.max_length=1000 .* set task.max_length=1024"):
        PathfinderDataModule(data_dir=str(tmp_path), max_length=1000, batch_size=4, cache_dir=None, resolution=32)


def test_cache_built_with_other_settings_is_rebuilt(tmp_path, caplog):
    root = tmp_path / "pf"
    write_pathfinder(root, count=10)
    cache = tmp_path / "cache"
    first = module(root, cache_dir=cache).load_split("train")
    path = module(root, cache_dir=cache).cache_path("train")
    stored = torch.load(path, weights_only=True)
    stored["settings"]["seed"] = 99  # a cache file whose recorded settings differ from ours
    stored["ids"] = torch.zeros_like(stored["ids"])
    torch.save(stored, path)
    with caplog.at_level(logging.WARNING):
        again = module(root, cache_dir=cache).load_split("train")
    assert "other settings" in caplog.text and again.ids.equal(first.ids)
    metadata = root / "metadata" / "0.npy"
    metadata.write_text(metadata.read_text() + "imgs/0 sample_0.png 0 1\n")  # one more listed sample
    changed = module(root, cache_dir=cache)
    assert changed.cache_path("train") != path  # edited metadata: another cache key, so a fresh read
    assert len(changed.load_split("train")) == int(10 * 0.8)  # 9 non-empty + 1 listed again = 10


def test_reader_reads_what_the_generator_writes(tmp_path):
    out = tmp_path / "pathfinder32" / "curv_contour_length_14"
    pathfinder_cli(["generate", "--out", str(out), "--resolution", "32", "--difficulty", "14", "--count", "10",
                    "--seed", "0", "--workers", "1"])  # what `python -m lra.tasks.pathfinder generate ...` runs
    listing = read_listing(out)
    assert len(listing.images) == 10 and listing.empty == 0 and set(listing.labels) == {0, 1}
    data = module(out)
    total = sum(len(data.load_split(split)) for split in ("train", "val", "test"))
    assert total == 10 and data.load_split("train").ids.max() > 0


def test_pathx_reads_128_pixel_images(tmp_path):
    root = tmp_path / "pathfinder128" / "curv_contour_length_14"
    written = write_pathfinder(root, resolution=128, count=11)
    data = module(root, resolution=128)
    splits = [data.load_split(split) for split in ("train", "val", "test")]
    assert splits[0].ids.shape[1] == 16384
    union = set().union(*(rows_of(s) for s in splits))
    assert union == {(tuple(pixels.tolist()), label) for pixels, label in written.values()}
