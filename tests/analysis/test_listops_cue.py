"""First-operator cue of ListOps: the operator reader, the fitted rule, and the CLI against a count made here."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import pytest
import torch
from tests.conftest import run_cli

from lra.tasks import listops, listops_generator
from lra.analysis.listops_cue import accuracy, balanced_accuracy, first_operator, fit, read_examples, split_accuracies


def test_first_operator_is_the_root():
    tree = ("[SM", [("[MAX", [1, 2]), 3])
    source = listops_generator.to_string(tree)
    assert source.startswith("( ( ( [SM ( ( ( [MAX")
    assert first_operator(source) == "[SM"
    with pytest.raises(ValueError, match="no ListOps operator"):
        first_operator("( 3 )")


def test_rule_is_the_majority_label_per_operator():
    examples = [("[MAX 9 ]", 9), ("[MAX 1 ]", 1), ("[MAX 9 ]", 9), ("[MIN 0 ]", 0), ("[SM 3 ]", 3), ("[SM 5 ]", 5)]
    cue = fit(examples)
    assert cue.rule == {"[MIN": 0, "[MAX": 9, "[MED": 0, "[SM": 3}  # SM: tie -> smallest label; MED unseen -> 0
    assert accuracy(cue, examples) == pytest.approx(4 / 6)
    # Per operator: MAX 2/3, MIN 1/1, SM 1/2; MED absent from the examples, so not averaged in.
    assert balanced_accuracy(cue, examples) == pytest.approx((2 / 3 + 1 + 1 / 2) / 3)


@pytest.mark.process
def test_cli_matches_an_independent_count(tmp_path):
    listops_generator.generate(tmp_path, {"train": 300, "val": 50, "test": 80}, seed=3, min_length=10, max_length=80)
    train, test = (read_examples(tmp_path / f"basic_{split}.tsv") for split in ("train", "test"))
    root = re.compile(r"\[(MIN|MAX|MED|SM)")
    by_root = defaultdict(Counter)
    for source, label in train:
        by_root[root.search(source).group(1)][label] += 1
    majority = {op: max(sorted(counts), key=counts.__getitem__) for op, counts in by_root.items()}
    correct = sum(majority[root.search(source).group(1)] == label for source, label in test)

    result = run_cli(["-m", "lra.analysis.listops_cue", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"test: {100 * correct / len(test):.2f} % of {len(test)}" in result.stdout


@pytest.mark.process
def test_cli_names_missing_data(tmp_path):
    result = run_cli(["-m", "lra.analysis.listops_cue", str(tmp_path)])
    assert result.returncode != 0
    assert "basic_train.tsv not found" in result.stderr and "listops generate" in result.stderr


def test_training_cue_on_token_ids_is_the_cue_on_the_files(tmp_path):
    """``lra.tasks.listops.first_operator_cue`` (what training records, on the cached token ids, sequences cut to
    ``max_length``) scores what the file-based probe scores on every split."""
    listops_generator.generate(tmp_path, {"train": 300, "val": 50, "test": 80, "independent_test": 60}, seed=4, min_length=10,
                     max_length=80)
    data = listops.ListOpsDataModule(data_dir=str(tmp_path), max_length=40, batch_size=8, cache_dir=None)
    data.setup("fit")
    record = data.shortcut_record()
    expected = split_accuracies(tmp_path)
    assert set(expected) == {"val", "test", "independent_test"}
    assert {split: record[f"shortcut_{split}_acc"] for split in expected} == expected
    assert record["shortcut"].startswith("first-operator cue")


def test_root_operators_scans_past_leading_tokens_and_refuses_rows_without_one():
    ids = torch.tensor([[listops.TOKEN_IDS["3"], listops.TOKEN_IDS["[SM"], listops.TOKEN_IDS["[MAX"]],
                        [listops.TOKEN_IDS["[MIN"], 0, 0]], dtype=torch.int16)
    assert listops.root_operators(ids) == ["[SM", "[MIN"]
    with pytest.raises(ValueError, match="1 ListOps example"):
        listops.root_operators(torch.tensor([[listops.TOKEN_IDS["3"], 0]], dtype=torch.int16))
