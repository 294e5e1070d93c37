"""lra.analysis.report on hand-written run records: grouping, mean ± std, published matching, failures, formats, plot."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import yaml

from lra import REPO_ROOT
from lra.analysis import listops_cue, report
from lra.analysis.significance import mcnemar
from lra.tasks import listops


def write_run(root: Path, name: str, task: str, attention: str, seed: int, acc: float | None, *,
              status: str = "completed", overrides: list[str] = (), config: dict | None = None, tags=()) -> None:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    record = {
        "task": task, "attention": attention, "seed": seed, "status": status, "test_acc": acc,
        "val_acc_best": acc, "samples_per_s": 100.0 + seed, "peak_mem_bytes": 2**20 * (10 + seed),
        "overrides": [f"task={task}", f"attention={attention}", f"seed={seed}", *overrides],
        "config": {"tags": list(tags), "attention": {"name": attention, **(config or {})}},
    }
    if status == "failed":
        record["error"] = "RuntimeError: boom"
    (run_dir / "results.json").write_text(json.dumps(record))


def test_groups_by_task_attention_and_differing_overrides(tmp_path):
    for i, (m, seed, acc) in enumerate([(32, 0, 0.40), (32, 1, 0.42), (64, 0, 0.50), (64, 1, 0.53), (64, 2, 0.56)]):
        write_run(tmp_path, f"{i}", "listops", "curformer", seed, acc,
                  overrides=[f"attention.num_landmarks={m}", "trainer.max_steps=10"])
    rows, settings = report.group_runs(report.collect([tmp_path]))
    assert settings == {"listops": ["attention.num_landmarks"]}  # max_steps is the same for every run: not a column
    summary = {s["attention.num_landmarks"]: s for s in report.summarize(rows, {})}
    assert summary["32"]["seeds"] == 2 and summary["64"]["seeds"] == 3
    assert summary["64"]["test_acc_mean"] == pytest.approx(53.0)
    assert summary["64"]["test_acc_std"] == pytest.approx(3.0)  # sample std of 50, 53, 56
    assert summary["32"]["test_acc_std"] == pytest.approx(math.sqrt(2.0))  # (40, 42): sqrt(((1)^2 + (1)^2) / 1)



def test_positions_and_pretraining_are_columns_where_runs_differ(tmp_path):
    """The shortcut issue's recipes (``model/positions=``, ``pretrain.steps=``) are setting columns of the task's
    table once its runs differ in them; a run that leaves one at its default shows "-", explained under the table."""
    recipes = {"scratch": [], "rotary": ["model/positions=rotary"], "both": ["model/positions=rotary", "pretrain.steps=2500"]}
    for name, overrides in recipes.items():
        write_run(tmp_path / "runs", name, "listops", "curformer", 0, 0.36, overrides=overrides)
    out = tmp_path / "table.md"
    assert report.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    header = [cell.strip() for cell in lines[2].strip("|").split("|")]
    assert header[:3] == ["attention", "model/positions", "pretrain.steps"]
    cells = sorted(tuple(cell.strip() for cell in line.strip("|").split("|"))[1:3] for line in lines[4:7])
    assert cells == [("-", "-"), ("rotary", "-"), ("rotary", "2500")]
    assert "-: the setting's config default (the row's runs do not override it)." in lines


def test_file_locations_do_not_split_seeds(tmp_path):
    """``paths.*`` (cache, logs) say where files live; runs differing only there are seeds of one row."""
    write_run(tmp_path, "a", "listops", "curformer", 0, 0.34, overrides=["task.data_dir=/d"])
    write_run(tmp_path, "b", "listops", "curformer", 1, 0.35, overrides=["task.data_dir=/d", "paths.cache_dir=/c"])
    write_run(tmp_path, "c", "listops", "curformer", 2, 0.30, overrides=["task.data_dir=/other"])
    write_run(tmp_path, "d", "listops", "curformer", 3, 0.36, overrides=[f"task.data_dir={REPO_ROOT / 'data' / 'x'}"])
    write_run(tmp_path, "e", "listops", "curformer", 4, 0.37, overrides=["task.data_dir=data/x"])
    rows, settings = report.group_runs(report.collect([tmp_path]))
    assert settings == {"listops": ["task.data_dir"]}  # another dataset still splits
    assert sorted(len(row.runs) for row in rows) == [1, 2, 2]  # data/x and <repo>/data/x: one dataset, one row

def test_published_row_follows_tags_and_match(tmp_path):
    tables = yaml.safe_load(report.PUBLISHED.read_text())
    write_run(tmp_path, "a", "listops", "curformer", 0, 0.40, config={"selection": "abs"})
    write_run(tmp_path, "b", "listops", "curformer", 0, 0.41, config={"selection": "sum"}, overrides=["attention.selection=sum"])
    write_run(tmp_path, "c", "text", "softmax", 0, 0.60, tags=["proxyformer_table1"], overrides=["experiment=proxyformer_table1"])
    write_run(tmp_path, "d", "text", "softmax", 0, 0.61)
    summary = report.summarize(*[report.group_runs(report.collect([tmp_path]))[0]], tables)
    by_key = {(s["task"], s["attention"], s.get("attention.selection"), s.get("experiment")): s for s in summary}
    abs_row = by_key[("listops", "curformer", "-", None)]  # each task's table has its own setting columns
    assert (abs_row["published"], abs_row["published_table"]) == (39.62, "cur_table1")
    assert abs_row["delta"] == pytest.approx(40.0 - 39.62)
    sum_row = by_key[("listops", "curformer", "sum", None)]
    assert (sum_row["published"], sum_row["published_table"]) == (38.99, "cur_table4_selection")
    assert by_key[("text", "softmax", None, "proxyformer_table1")]["published"] == 64.84   # tagged: its own table
    # Untagged: the first table whose row is comparable. CUR Table 1 quotes Tay et al.'s original-size
    # Transformer (not comparable with our 2 x d64 one), so the Proxyformer paper's re-implementation wins.
    assert by_key[("text", "softmax", None, "-")]["published"] == 64.84


def test_failed_interrupted_and_missing_runs_are_counted_and_listed(tmp_path):
    write_run(tmp_path, "ok", "listops", "softmax", 0, 0.30)
    write_run(tmp_path, "bad", "listops", "softmax", 1, None, status="failed")
    write_run(tmp_path, "stopped", "listops", "softmax", 3, None, status="interrupted")
    write_run(tmp_path, "later", "listops", "softmax", 4, None, status="not_started")
    killed = tmp_path / "killed" / ".hydra"
    killed.mkdir(parents=True)
    (killed / "config.yaml").write_text(yaml.safe_dump({"seed": 2, "task": {"name": "listops"}, "attention": {"name": "softmax"}}))
    (killed / "overrides.yaml").write_text(yaml.safe_dump(["seed=2"]))
    out = tmp_path / "table.md"
    assert report.main([str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    header, row = (line for line in text.splitlines() if line.startswith("| "))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert [cell.strip() for cell in header.strip("|").split("|")][1:5] == ["seeds", "failed", "interrupted", "missing"]
    assert cells[:5] == ["softmax", "1", "1", "1", "2"]  # seeds completed, failed, interrupted, missing (+ not started)
    assert "failed: listops / softmax / seed 1" in text and "RuntimeError: boom" in text
    assert "missing: listops / softmax / seed 2" in text
    assert "interrupted: listops / softmax / seed 3" in text and "not_started: listops / softmax / seed 4" in text


def test_csv_latex_and_plot(tmp_path):
    for seed, acc in enumerate([0.2, 0.4]):
        write_run(tmp_path / "runs", f"s{seed}", "image", "softmax", seed, acc)
    out_csv, out_tex, out_png = tmp_path / "t.csv", tmp_path / "t.tex", tmp_path / "fig.png"
    assert report.main([str(tmp_path / "runs"), "--format", "csv", "--out", str(out_csv), "--plot", str(out_png)]) == 0
    (row,) = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert float(row["test_acc_mean"]) == pytest.approx(30.0) and float(row["published"]) == 38.57  # Proxyformer Table 1 (CUR Table 1's is not comparable)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.main([str(tmp_path / "runs"), "--format", "latex", "--out", str(out_tex)]) == 0
    assert r"\begin{tabular}" in out_tex.read_text() and r"30.00 $\pm$ 14.14" in out_tex.read_text()


def test_empty_or_absent_dir_is_an_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 1
    assert "no runs" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="sweep dir not found"):
        report.main([str(tmp_path / "absent")])


def test_published_file_is_consistent():
    tables = yaml.safe_load(report.PUBLISHED.read_text())
    for name, table in tables.items():
        assert table["source"], name
        for row in table["rows"]:
            assert len(row["acc"]) == len(table["tasks"]), (name, row["attention"])
            assert all(0 < value < 100 for value in row["acc"])


def test_steps_wall_time_and_learning_curves(tmp_path):
    for seed, minutes in enumerate([10.0, 20.0]):
        write_run(tmp_path / "runs", f"s{seed}", "listops", "curformer", seed, 0.3 + seed / 10)
        path = tmp_path / "runs" / f"s{seed}" / "results.json"
        record = json.loads(path.read_text())
        record.update(steps=5000, train_time_s=60 * minutes, val_curve=[[250, 0.17], [500, 0.2 + seed / 10]])
        path.write_text(json.dumps(record))
    out_csv, curves = tmp_path / "t.csv", tmp_path / "curves.png"
    assert report.main([str(tmp_path / "runs"), "--format", "csv", "--out", str(out_csv), "--curves", str(curves)]) == 0
    (row,) = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert int(row["steps"]) == 5000 and float(row["train_time_min"]) == pytest.approx(15.0)
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no run has a val_curve"):
        write_run(tmp_path / "old", "s0", "listops", "curformer", 0, 0.3)
        report.main([str(tmp_path / "old"), "--curves", str(tmp_path / "none.png")])


def test_curve_legend_names_the_settings_that_split_the_table(tmp_path):
    from lra.analysis.report_plot import curve_label

    for name, pooling in (("a", "mean"), ("b", "padded_mean")):
        write_run(tmp_path, name, "listops", "curformer", 0, 0.34, overrides=[f"model/pooling={pooling}"])
    rows, settings = report.group_runs(report.collect([tmp_path]))
    assert settings == {"listops": ["model/pooling"]}
    labels = sorted(curve_label(run, row.settings) for row in rows for run in row.runs)
    assert labels == ["curformer s0 model/pooling=mean, test 34.00%", "curformer s0 model/pooling=padded_mean, test 34.00%"]


def test_truncated_results_json_names_the_file(tmp_path):
    write_run(tmp_path / "runs", "s0", "listops", "softmax", 0, 0.3)
    path = tmp_path / "runs" / "s0" / "results.json"
    path.write_text(path.read_text()[:40])
    with pytest.raises(ValueError, match=f"{path}: not valid JSON.*re-run the job"):
        report.main([str(tmp_path / "runs")])


def test_mcnemar_exact_p_values():
    # b = 10 (only A right), c = 2 (only B right): p = 2 (C(12,0) + C(12,1) + C(12,2)) / 2^12 = 158 / 4096
    labels = [1] * 20
    a = [1] * 10 + [0] * 2 + [1] * 5 + [0] * 3
    b = [0] * 10 + [1] * 2 + [1] * 5 + [0] * 3
    test = mcnemar(a, b, labels)
    assert (test.b, test.c, test.n) == (10, 2, 20)
    assert test.p == pytest.approx(158 / 4096, rel=1e-12)
    assert mcnemar(b, a, labels).p == pytest.approx(test.p, rel=1e-12)  # symmetric
    assert mcnemar(a, a, labels).p == 1.0  # no discordant example
    with pytest.raises(ValueError, match="same examples"):
        mcnemar(a, b[:-1], labels)


def test_listops_table_has_independent_test_shortcut_and_paired_test(tmp_path, capsys):
    data = tmp_path / "data"
    listops.generate(data, {"train": 60, "val": 20, "test": 20, "independent_test": 40}, seed=1, min_length=10,
                     max_length=40)
    labels = [int(line.rsplit("\t", 1)[1]) for line in (data / "basic_independent_test.tsv").read_text().splitlines()[1:]]
    wrong = [(y + 1) % 10 for y in labels]
    runs = {"abs": labels[:30] + wrong[30:], "sum": labels[:10] + wrong[10:]}  # abs right on 30, sum on 10 of 40
    for selection, predicted in runs.items():
        write_run(tmp_path / "runs", selection, "listops", "curformer", 0, 0.3, overrides=[f"attention.selection={selection}"],
                  config={"selection": selection})
        run_dir = tmp_path / "runs" / selection
        record = json.loads((run_dir / "results.json").read_text())
        record["config"]["task"] = {"name": "listops", "data_dir": str(data), "num_classes": 10}
        record["independent_test_acc"] = sum(p == y for p, y in zip(predicted, labels)) / len(labels)
        (run_dir / "results.json").write_text(json.dumps(record))
        (run_dir / "predictions.json").write_text(json.dumps({"independent_test": {"pred": predicted, "label": labels}}))
    out = tmp_path / "table.md"
    assert report.main([str(tmp_path / "runs"), "--out", str(out), "--baseline", "curformer attention.selection=abs"]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "### listops"
    header = [cell.strip() for cell in lines[2].strip("|").split("|")]
    rows = {cells[1]: dict(zip(header, cells)) for cells in
            ([cell.strip() for cell in line.strip("|").split("|")] for line in lines[4:6])}
    cue = listops_cue.split_accuracies(data)
    for row in rows.values():
        assert row["shortcut test %"] == f"{100 * cue['test']:.2f}"
        assert row["shortcut indep. %"] == f"{100 * cue['independent_test']:.2f}"
    assert (rows["abs"]["independent test %"], rows["sum"]["independent test %"]) == ("75.00", "25.00")
    assert rows["abs"]["p (McNemar)"] == "baseline"
    assert rows["sum"]["p (McNemar)"] == f"{mcnemar(runs['sum'], runs['abs'], labels).p:.2g}"  # b = 0, c = 20
    assert any("exact two-sided test against `curformer attention.selection=abs`" in line for line in lines)
    assert any(line.startswith("shortcut: the first-operator cue") for line in lines)
    with pytest.raises(SystemExit):  # a baseline that names no row is refused, not replaced by another row
        report.main([str(tmp_path / "runs"), "--out", str(out), "--baseline", "curformer attention.selection=step"])
    assert "names no row; the rows are: curformer attention.selection=abs; curformer attention.selection=sum" in \
        capsys.readouterr().err
