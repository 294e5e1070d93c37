"""Data is checked when it is first read or cached: the first bad example is named with its file and line, and a
run fails before its first training step (lra.tasks.splits.first_bad_example, each task's reader)."""

from __future__ import annotations

import json
import pickle
import shutil

import numpy as np
import pytest
import torch

from lra.tasks import image, listops, listops_generator, retrieval, text
from lra.tasks.splits import TokenizedSplit, first_bad_example
from tests.conftest import run_in_process


def split(ids, lengths, labels) -> TokenizedSplit:
    return TokenizedSplit(torch.tensor(ids, dtype=torch.int16), torch.tensor(lengths, dtype=torch.int32),
                          torch.tensor(labels))


def test_first_bad_example_names_the_first_of_each_kind():
    good = split([[3, 4, 0], [5, 0, 0]], [2, 1], [0, 1])
    assert first_bad_example(good, num_classes=2, vocab_size=6) is None
    assert first_bad_example(split([[3, 4, 0], [5, 0, 0]], [2, 1], [0, 2]), 2, 6) == (
        1, "label 2 outside 0..1 (task.num_classes)")
    assert first_bad_example(split([[3, 9, 0], [5, 0, 0]], [2, 1], [0, 1]), 2, 6) == (
        0, "token id 9 outside 0..5 (task.vocab_size)")
    assert first_bad_example(split([[3, 4, 0], [0, 0, 0]], [2, 0], [0, 1]), 2, 6) == (1, "it holds no tokens")
    pairs = split([[[3, 0], [4, 0]], [[3, 0], [0, 0]]], [[1, 1], [1, 0]], [0, 1])  # Retrieval: (N, 2, L)
    assert first_bad_example(pairs, 2, 6) == (1, "it holds no tokens")
    many = split([[1]] * 9000 + [[7]], [1] * 9001, [0] * 9001)
    assert first_bad_example(many, 2, 6, rows=4096) == (9000, "token id 7 outside 0..5 (task.vocab_size)")


@pytest.mark.parametrize("line, problem", [
    ("some English\t3", "'some' is not a ListOps token"),
    ("( ( 3 ) )\t3", "no operator"),
    ("[MAX 2 9 ]\t12", "target digit 0-9"),
    ("[MAX 2 9 ]\t5.0", r"found the target '5\.0'"),  # quoted whole, not cut at 80 characters of the line
    ("[MAX 2 [MIN 9 4 ]\t4", r"1 operator\(s\) not closed by '\]'"),
    ("[MAX 2 9 ] ]\t9", "the tree ends at token 4 of 5: more follows it"),
    ("[MAX 2 [MED 1 2 3 8 ] ]\t3", r"the target 3 is not the value of its expression \(2\)"),
])
def test_a_listops_line_that_is_not_listops_is_named_by_file_and_line(tmp_path, line, problem):
    path = tmp_path / "basic_train.tsv"
    path.write_text(f"{listops_generator.HEADER}\n[MAX 2 9 ]\t9\n\n{line}\n[MIN 1 2 ]\t1\n")
    with pytest.raises(ValueError, match=rf"^{path}:4: .*{problem}"):
        listops.read_tsv(path)


def test_a_cached_bad_example_is_named_by_its_line(tiny_listops, tmp_path):
    """A cache built by an older version from bad data is checked on load too, and the example named by file:line."""
    data = listops.ListOpsDataModule(data_dir=str(tiny_listops), max_length=60, batch_size=4, cache_dir=str(tmp_path))
    data.setup()
    path = data.cache_path("val")
    stored = torch.load(path, weights_only=True)
    stored["labels"][5] = 11
    torch.save(stored, path)
    with pytest.raises(ValueError, match=r"basic_val.tsv:7: not a listops example: label 11 outside 0..9"):
        listops.ListOpsDataModule(data_dir=str(tiny_listops), max_length=60, batch_size=4,
                                  cache_dir=str(tmp_path)).setup()


def test_text_retrieval_and_image_readers_name_the_bad_example(tmp_path):
    for name, label in text.LABELS.items():
        (tmp_path / "aclImdb" / "train" / name).mkdir(parents=True)
        (tmp_path / "aclImdb" / "train" / name / "0_7.txt").write_text("fine")
    (tmp_path / "aclImdb" / "train" / "pos" / "1_8.txt").write_text("")
    with pytest.raises(ValueError, match=r"pos/1_8.txt: an empty review"):
        text.read_folder(tmp_path / "aclImdb", "train", 100)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("1.0\ta\tb\tone\ttwo\n0.0\ta\tc\tthree\t\n")
    with pytest.raises(ValueError, match=rf"^{pairs}:2: document text2 is empty"):
        retrieval.read_tsv(pairs, 100)
    batch = tmp_path / "data_batch_1"
    batch.write_bytes(pickle.dumps({b"data": np.zeros((3, 3072), np.uint8), b"labels": [1, 10, 2]}))
    with pytest.raises(ValueError, match=rf"^{batch}: image 2 has label 10"):
        image.read_pickles(tmp_path, ("data_batch_1",))


def test_a_train_file_with_an_english_line_fails_before_step_1(tiny_listops, tiny_listops_overrides, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_listops, data_dir)
    train = data_dir / "basic_train.tsv"
    lines = train.read_text().splitlines()
    lines.insert(10, "some English\t3")
    train.write_text("\n".join(lines) + "\n")
    run_dir = tmp_path / "run"
    overrides = [o for o in tiny_listops_overrides if not o.startswith("task.data_dir")]
    proc = run_in_process(["-m", "lra.train", *overrides, f"task.data_dir={data_dir}", f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 1
    failed = [line for line in proc.stderr.splitlines() if line.startswith("[lra] FAILED:")]
    assert len(failed) == 1 and f"{train}:11: not a ListOps example: 'some' is not a ListOps token" in failed[0]
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "failed" and record["steps"] == 0
    assert not list((run_dir / "checkpoints").glob("*.ckpt")) if (run_dir / "checkpoints").exists() else True
    assert "Traceback" not in proc.stderr


def test_listops_examples_longer_than_max_length_are_noted(tiny_listops, tmp_path, capsys):
    data = listops.ListOpsDataModule(data_dir=str(tiny_listops), max_length=20, batch_size=4, cache_dir=None)
    data.setup()
    out = capsys.readouterr().out
    assert f"examples of {tiny_listops / 'basic_train.tsv'} are longer than task.max_length=20 tokens" in out
    assert int(data.splits["train"].lengths.max()) == 20


def test_a_cached_example_without_an_operator_is_named_by_its_line(tiny_listops, tmp_path):
    data = listops.ListOpsDataModule(data_dir=str(tiny_listops), max_length=60, batch_size=4, cache_dir=str(tmp_path))
    data.setup()
    path = data.cache_path("test")
    stored = torch.load(path, weights_only=True)
    stored["ids"][3, : stored["lengths"][3]] = listops.TOKEN_IDS["4"]  # digits only
    torch.save(stored, path)
    with pytest.raises(ValueError, match=r"basic_test.tsv:5: not a listops example: no operator"):
        listops.ListOpsDataModule(data_dir=str(tiny_listops), max_length=60, batch_size=4,
                                  cache_dir=str(tmp_path)).setup()


def test_a_retrieval_label_that_is_not_exactly_0_or_1_is_named(tmp_path):
    """``0.5`` is no label (``int(float('0.5'))`` read it as 0); ``1.0`` is one."""
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("1.0\ta\tb\tone\ttwo\n0.5\ta\tc\tthree\tfour\n")
    with pytest.raises(ValueError, match=rf"^{pairs}:2: the label column must be 0 or 1 .*found '0\.5'"):
        retrieval.read_tsv(pairs, 100)


def test_training_data_of_one_class_is_refused(tmp_path):
    """aclImdb without its neg/ folder: every training example is positive; refused naming where it was read."""
    (tmp_path / "aclImdb" / "train" / "pos").mkdir(parents=True)
    (tmp_path / "aclImdb" / "test").mkdir()
    for index in range(3):
        (tmp_path / "aclImdb" / "train" / "pos" / f"{index}_8.txt").write_text("a fine film")
    data = text.TextDataModule(data_dir=str(tmp_path / "aclImdb"), max_length=50, batch_size=2, cache_dir=None,
                               source="folder", val_split=None)
    with pytest.raises(ValueError, match=r"train/\{neg,pos\}/\*\.txt: every one of the 3 training examples has label 1"):
        data.load_split("train")
