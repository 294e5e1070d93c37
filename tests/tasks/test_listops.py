"""ListOps generator and reader: format, bounds, labels (independent evaluator), determinism, errors."""

from __future__ import annotations

import statistics

import pytest

from lra.tasks import listops, listops_generator
from lra.tasks.splits import SPLITS


def evaluate_source(source: str) -> int:
    """Independent evaluator of an official-format Source string (stack machine over its tokens)."""
    operations = {
        "[MIN": min,
        "[MAX": max,
        "[MED": lambda values: int(statistics.median(values)),
        "[SM": lambda values: sum(values) % 10,
    }
    stack: list[list] = []
    result = None
    for token in source.split():
        if token in ("(", ")"):
            continue
        if token in operations:
            stack.append([token])
        elif token == "]":
            operator, *values = stack.pop()
            value = operations[operator](values)
            if stack:
                stack[-1].append(value)
            else:
                result = value
        else:
            if stack:
                stack[-1].append(int(token))
            else:
                result = int(token)
    assert not stack, f"unbalanced source: {source[:80]}"
    return result


def token_length(source: str) -> int:
    """Values + 2 per operator, the official length measure."""
    tokens = source.split()
    return sum(token.isdigit() for token in tokens) + 2 * sum(token.startswith("[") for token in tokens)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen")
    listops_generator.generate(out, {"train": 120, "val": 30, "test": 30}, seed=3, min_length=20, max_length=90)
    return out


def test_generated_lines_parse_obey_bounds_and_targets_are_correct(generated):
    for split in SPLITS:
        lines = (generated / f"basic_{split}.tsv").read_text().splitlines()
        assert lines[0] == "Source\tTarget"
        for line in lines[1:]:
            source, target = line.split("\t")
            assert 20 < token_length(source) < 90
            assert int(target) == evaluate_source(source)


def test_examples_are_unique_across_splits(generated):
    sources = [
        line.split("\t")[0]
        for split in SPLITS
        for line in (generated / f"basic_{split}.tsv").read_text().splitlines()[1:]
    ]
    assert len(sources) == len(set(sources)) == 180


def test_same_seed_identical_bytes_other_seed_differs(tmp_path):
    sizes = {"train": 20, "val": 5, "test": 5}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        listops_generator.generate(tmp_path / name, sizes, seed=seed, min_length=10, max_length=60)
    read = lambda name: (tmp_path / name / "basic_train.tsv").read_bytes()
    assert read("a") == read("b")
    assert read("a") != read("c")


def test_reader_accepts_official_file_and_tokenizes_with_fixed_vocab(tmp_path):
    path = tmp_path / "basic_train.tsv"
    path.write_text("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n( ( ( [SM 4 ) ( ( ( [MIN 7 ) 3 ) ] ) ) ] )\t7\n")
    sequences, labels = listops.read_tsv(path)
    ids = listops.TOKEN_IDS
    assert sequences[0] == [ids["[MAX"], ids["2"], ids["9"], ids["X"]]
    assert sequences[1] == [ids["[SM"], ids["4"], ids["[MIN"], ids["7"], ids["3"], ids["X"], ids["X"]]
    assert labels == [9, 7]
    assert len(listops.VOCAB) == 17 and listops.VOCAB[0] == "<pad>"


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "basic_val.tsv"
    path.write_text("Source\tTarget\n( ( [MAX 2 ) ] )\t2\nno target here\n")
    with pytest.raises(ValueError, match=r"basic_val\.tsv:3"):
        listops.read_tsv(path)


def test_missing_data_dir_says_how_to_get_data(tmp_path):
    module = listops.ListOpsDataModule(
        data_dir=str(tmp_path / "nowhere"), max_length=100, batch_size=4, cache_dir=str(tmp_path / "cache")
    )
    with pytest.raises(FileNotFoundError, match="python -m lra.tasks.listops generate"):
        module.setup()


def test_cache_is_rebuilt_when_settings_change(tiny_listops, tmp_path):
    make = lambda max_length: listops.ListOpsDataModule(
        data_dir=str(tiny_listops), max_length=max_length, batch_size=4, cache_dir=str(tmp_path)
    )
    short, long = make(8), make(60)
    short.setup()
    long.setup()
    assert short.splits["train"].ids.shape[-1] == 8
    assert long.splits["train"].ids.shape[-1] == 60
    assert short.cache_path("train") != long.cache_path("train")
    long.cache_path("train").write_bytes(b"corrupt")
    rebuilt = make(60)
    rebuilt.setup()
    assert rebuilt.splits["train"].ids.equal(long.splits["train"].ids)
