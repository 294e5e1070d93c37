"""LRA Text (IMDB, byte level): folder and TFDS readers, splits, errors, cache, a few training steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from lra.tasks.text import TextDataModule

REVIEWS = {
    ("train", "pos"): ["A wonderful film.", "Caf\u00e9 cr\u00e8me \U0001F600 loved it " * 8, "Great!"],
    ("train", "neg"): ["Awful.", "Not good at all, " * 10, "Meh\tboring\n2/10"],
    ("test", "pos"): ["Brilliant acting.", "\u00fcber gut"],
    ("test", "neg"): ["Terrible plot.", "Waste of time " * 6],
}


def write_imdb(root: Path) -> Path:
    """A tiny ``aclImdb`` folder at ``root``: ``{train,test}/{pos,neg}/<id>_<rating>.txt``."""
    for (split, polarity), texts in REVIEWS.items():
        folder = root / split / polarity
        folder.mkdir(parents=True)
        for i, text in enumerate(texts):
            (folder / f"{i}_{8 if polarity == 'pos' else 2}.txt").write_bytes(text.encode("utf-8"))
    return root


@pytest.fixture(scope="module")
def imdb(tmp_path_factory) -> Path:
    return write_imdb(tmp_path_factory.mktemp("data") / "aclImdb")


def expected(split: str, max_length: int) -> list[tuple[list[int], int]]:
    """Reference: (ids, label) in the reader's order (neg then pos, files by name), id = byte + 1."""
    rows = []
    for polarity, label in (("neg", 0), ("pos", 1)):
        for i, text in enumerate(REVIEWS[(split, polarity)]):
            raw = text.encode("utf-8")[:max_length]
            rows.append(([byte + 1 for byte in raw], label))
    return rows


def module(data_dir: Path, **kwargs) -> TextDataModule:
    return TextDataModule(data_dir=str(data_dir), max_length=kwargs.pop("max_length", 48), batch_size=4,
                          cache_dir=kwargs.pop("cache_dir", None), **kwargs)


def assert_matches(split, rows) -> None:
    assert split.ids.shape == (len(rows), 48)
    for i, (ids, label) in enumerate(rows):
        assert split.ids[i, : len(ids)].tolist() == ids
        assert split.ids[i, len(ids):].eq(0).all()
        assert int(split.lengths[i]) == len(ids)
        assert int(split.labels[i]) == label


def test_folder_reader_gives_byte_ids_labels_and_lengths(imdb):
    data = module(imdb)
    assert_matches(data.load_split("train"), expected("train", 48))
    assert_matches(data.load_split("test"), expected("test", 48))
    multibyte = data.load_split("train").ids[4]  # the long positive review with 'é' (0xC3 0xA9)
    assert multibyte[3].item() == 0xC3 + 1 and multibyte[4].item() == 0xA9 + 1


def test_validation_is_imdb_test_unless_val_split_holds_out_train(imdb):
    default = module(imdb)
    assert default.load_split("val").ids.equal(default.load_split("test").ids)
    held = module(imdb, val_split=0.5, seed=3)
    train, val = held.load_split("train"), held.load_split("val")
    assert len(train) == 3 and len(val) == 3
    full = {tuple(row.tolist()) for row in module(imdb).load_split("train").ids}
    parts = [tuple(row.tolist()) for row in train.ids] + [tuple(row.tolist()) for row in val.ids]
    assert set(parts) == full and len(set(parts)) == 6
    again = module(imdb, val_split=0.5, seed=3).load_split("val").ids
    assert again.equal(val.ids)


def test_missing_data_names_both_ways_to_get_it(tmp_path):
    for source in ("folder", "auto"):  # auto: no folder and no prepared TFDS copy in tfds_data_dir
        data = module(tmp_path / "absent", source=source, tfds_data_dir=str(tmp_path / "tfds"))
        with pytest.raises(FileNotFoundError, match=r"absent/train.*'python -m lra.data download imdb'.*--tfds imdb_reviews"):
            data.load_split("train")


def test_bad_settings_name_the_config_key(imdb):
    with pytest.raises(ValueError, match="task.datamodule.val_split"):
        module(imdb, val_split=1.5)
    with pytest.raises(ValueError, match="task.datamodule.source"):
        module(imdb, source="hub")


def test_cache_is_rebuilt_when_a_review_changes(imdb, tmp_path):
    root = write_imdb(tmp_path / "aclImdb")
    first = module(root, cache_dir=tmp_path / "cache").load_split("test")
    assert module(root, cache_dir=tmp_path / "cache").cache_path("test").exists()
    (root / "test" / "neg" / "0_2.txt").write_text("Changed!!")
    second = module(root, cache_dir=tmp_path / "cache").load_split("test")
    assert not second.ids.equal(first.ids)
    assert second.ids[0, :9].tolist() == [b + 1 for b in b"Changed!!"]


@pytest.mark.slow
def test_tfds_source_reads_imdb_reviews():
    tfds = pytest.importorskip("tensorflow_datasets", reason="pip install -r requirements-data.txt")
    with tfds.testing.mock_data(num_examples=5):
        reference = list(tfds.data_source("imdb_reviews", split="test"))
        data = TextDataModule(data_dir="/nonexistent", max_length=48, batch_size=4, cache_dir=None, source="tfds")
        split = data.load_split("test")
    assert len(split) == 5
    for i, example in enumerate(reference):
        text = example["text"].encode() if isinstance(example["text"], str) else example["text"]
        ids = [b + 1 for b in text[:48]]
        assert split.ids[i, : len(ids)].tolist() == ids and int(split.lengths[i]) == len(ids)
        assert int(split.labels[i]) == int(example["label"])
