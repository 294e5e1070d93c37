"""lra.analysis.report's paired test and cue on hand-made runs: the default McNemar baseline (plain-recipe softmax,
else CURformer, never a row at chance), pairs only on the same examples, the cue from the records or the data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lra.analysis import listops_cue, report
from lra.analysis.significance import mcnemar
from lra.tasks import listops_generator

from test_report import run_report, table_rows, write_run

LABELS = [0] * 60 + [i % 9 + 1 for i in range(140)]  # 200 examples, the majority label 0 on 30 %


def predicting(right: int, labels: list[int] = LABELS) -> list[int]:
    """Right on the first ``right`` examples, wrong (label + 1) on the rest."""
    return [y if i < right else (y + 1) % 10 for i, y in enumerate(labels)]


def write_listops(root: Path, name: str, attention: str, seed: int, predicted: list[int], *, data: str = "/x/data/a",
                  overrides: list[str] = (), labels: list[int] = LABELS) -> None:
    accuracy = sum(p == y for p, y in zip(predicted, labels)) / len(labels)
    run_dir = write_run(root, name, "listops", attention, seed, accuracy, independent_test_acc=accuracy,
                        overrides=[f"task.data_dir={data}", *overrides],
                        config={"task": {"name": "listops", "data_dir": data, "num_classes": 10}})
    (run_dir / "predictions.json").write_text(json.dumps({"independent_test": {"pred": predicted, "label": labels}}))


@pytest.fixture
def runs(tmp_path) -> Path:
    root = tmp_path / "runs"
    write_listops(root, "softmax", "softmax", 0, [0] * len(LABELS))            # always the majority label: at chance
    write_listops(root, "cur0", "curformer", 0, predicting(140))
    write_listops(root, "cur1", "curformer", 1, predicting(130))
    write_listops(root, "sum", "curformer", 0, predicting(100), overrides=["attention.selection=sum"])
    write_listops(root, "nystrom", "nystromformer", 0, predicting(120), data="/x/data/b")   # other data
    other_labels = LABELS[::-1]
    write_listops(root, "proxy", "proxyformer", 0, predicting(120, other_labels), labels=other_labels)  # other examples
    return root


def test_default_baseline_is_the_plain_curformer_row_when_softmax_is_at_chance(runs, capsys):
    out, _ = run_report([runs], capsys)
    _, rows = table_rows(out, "listops")
    by_label = {" ".join(filter(None, (row["attention"], row["setting"].replace("—", "")))).strip(): row for row in rows}
    assert by_label["curformer data a"]["p (McNemar)"] == "baseline"
    expected = mcnemar(predicting(100), predicting(140), LABELS).p  # seed 0 against seed 0
    assert by_label["curformer data a · selection=sum"]["p (McNemar)"] == f"{expected:.2g}"
    assert by_label["softmax data a"]["p (McNemar)"] == f"{mcnemar([0] * 200, predicting(140), LABELS).p:.2g}"
    assert by_label["nystromformer data b"]["p (McNemar)"] == "-"   # other data: not paired
    assert by_label["proxyformer data a"]["p (McNemar)"] == "-"     # other examples (labels): not paired
    assert ("against `curformer data a`, the plain-recipe curformer row (the plain-recipe softmax row has a run at "
            "chance).") in out


def test_a_plain_softmax_row_off_chance_is_the_default(runs, capsys):
    (runs / "softmax" / "results.json").unlink()
    (runs / "softmax" / "predictions.json").unlink()
    (runs / "softmax").rmdir()
    write_listops(runs, "softmax_ok", "softmax", 0, predicting(150))
    out, _ = run_report([runs], capsys)
    _, rows = table_rows(out, "listops")
    assert next(row for row in rows if row["attention"] == "softmax")["p (McNemar)"] == "baseline"
    assert "the plain-recipe softmax row." in out


def test_no_plain_row_off_chance_means_no_default_baseline(tmp_path, capsys):
    write_listops(tmp_path, "softmax", "softmax", 0, [0] * len(LABELS))
    write_listops(tmp_path, "sum", "curformer", 0, predicting(100), overrides=["attention.selection=sum"])
    out, _ = run_report([tmp_path], capsys)
    header, _ = table_rows(out, "listops")
    assert "p (McNemar)" not in header
    assert ("p (McNemar): none: no plain-recipe row has predictions off chance (the plain-recipe softmax row has a run "
            "at chance and the curformer row (curformer selection=sum) changes the plain recipe); --baseline ROW chooses "
            "one.") in out


def test_baseline_chosen_by_label_and_refused_when_it_names_no_row(runs, capsys):
    out, _ = run_report([runs, "--baseline", "curformer data a · selection=sum"], capsys)
    _, rows = table_rows(out, "listops")
    assert next(row for row in rows if "selection=sum" in row["setting"])["p (McNemar)"] == "baseline"
    assert "against `curformer data a · selection=sum`, chosen with --baseline." in out
    with pytest.raises(SystemExit):
        report.main([str(runs), "--baseline", "curformer selection=step"])
    assert "names no row; the rows are: curformer data a; curformer data a · selection=sum" in capsys.readouterr().err


def test_the_cue_comes_from_the_records_else_from_the_data(tmp_path, capsys):
    data = tmp_path / "data"
    listops_generator.generate(data, {"train": 60, "val": 20, "test": 20, "independent_test": 40}, seed=1, min_length=10,
                     max_length=40)
    cue = listops_cue.split_accuracies(data)
    config = {"task": {"name": "listops", "data_dir": str(data), "num_classes": 10}}
    write_run(tmp_path / "old", "s0", "listops", "curformer", 0, 0.3, independent_test_acc=0.3, config=config)
    write_run(tmp_path / "new", "s0", "listops", "softmax", 0, 0.3, independent_test_acc=0.3,
              config={"task": {"name": "listops", "data_dir": str(tmp_path / "gone"), "num_classes": 10}},
              shortcut="first-operator cue", shortcut_test_acc=0.25, shortcut_independent_test_acc=0.375)
    out, _ = run_report([tmp_path / "old", tmp_path / "new"], capsys)
    _, rows = table_rows(out, "listops")
    by_attention = {row["attention"]: row for row in rows}
    assert by_attention["curformer"]["cue test %"] == f"{100 * cue['test']:.2f}"          # computed from the data
    assert by_attention["curformer"]["cue indep. %"] == f"{100 * cue['independent_test']:.2f}"
    assert (by_attention["softmax"]["cue test %"], by_attention["softmax"]["cue indep. %"]) == ("25.00", "37.50")
