"""Shallow ListOps rules: the depth-1 parse against trees built here, the fitted rules counted by hand, and the
CLI's cue row against lra.analysis.listops_cue."""

from __future__ import annotations

import pytest

from lra.analysis import listops_cue, listops_shallow
from lra.analysis.listops_shallow import FEATURES, TopLevel, aggregate, rule_accuracy, top_level
from lra.tasks import listops_generator


def test_top_level_reads_the_roots_own_digits():
    tree = ("[MAX", [2, ("[MIN", [3, ("[SM", [4, 5])]), 9, ("[MED", [1])])
    assert top_level(listops_generator.to_string(tree)) == TopLevel("[MAX", (2, 9), 2)
    assert top_level(listops_generator.to_string(("[SM", [("[MAX", [1])]))) == TopLevel("[SM", (), 1)
    with pytest.raises(ValueError, match="starts with an operator"):
        top_level("( 3 )")


@pytest.mark.parametrize("root, digits, expected", [
    ("[MIN", (4, 2, 7), 2), ("[MAX", (4, 2, 7), 7), ("[MED", (1, 5, 8, 2), 3), ("[SM", (4, 2, 7), 3), ("[MAX", (), None),
])
def test_aggregate_applies_the_root_to_its_digits(root, digits, expected):
    assert aggregate(TopLevel(root, digits, 0)) == expected


def test_rules_by_hand():
    """MAX examples whose label is their largest digit: the cue gets the majority label, max-digit gets all."""
    train = [(TopLevel("[MAX", (1, 9), 0), 9), (TopLevel("[MAX", (3, 9), 0), 9), (TopLevel("[MAX", (2, 5), 0), 5),
             (TopLevel("[MAX", (7,), 0), 7)]
    test = [(TopLevel("[MAX", (9,), 0), 9), (TopLevel("[MAX", (5,), 0), 5), (TopLevel("[MAX", (8,), 0), 8)]
    assert rule_accuracy(FEATURES["root (the cue)"], train, test) == pytest.approx(1 / 3)
    # max 9 -> 9, max 5 -> 5 seen in training; max 8 unseen -> the cue's 9 (wrong)
    assert rule_accuracy(FEATURES["root + max digit"], train, test) == pytest.approx(2 / 3)


def test_cli_cue_row_equals_listops_cue(tmp_path, capsys):
    listops_generator.generate(tmp_path, {"train": 300, "val": 50, "test": 80}, seed=3, min_length=10, max_length=80)
    scores = listops_shallow.main([str(tmp_path), "--split", "test"])
    cue = listops_cue.fit(listops_cue.read_examples(tmp_path / "basic_train.tsv"))
    assert scores["root (the cue)"] == pytest.approx(listops_cue.accuracy(cue, listops_cue.read_examples(tmp_path / "basic_test.tsv")))
    assert "root + min and max digits" in capsys.readouterr().out
