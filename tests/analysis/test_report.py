"""lra.analysis.report on hand-written run records: compact settings, distinct seeds, duplicates, unreadable runs,
published matching and comparability, formats and columns."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path

import pytest
import yaml

from lra import REPO_ROOT
from lra.analysis import report
from lra.analysis.report_tables import COLUMNS, DEFAULT
from tests.conftest import run_cli


def write_run(root: Path, name: str, task: str, attention: str, seed: int, acc: float | None, *,
              status: str = "completed", overrides: list[str] = (), config: dict | None = None, tags=(),
              **fields) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    record = {
        "task": task, "attention": attention, "seed": seed, "status": status, "test_acc": acc,
        "val_acc_best": acc, "samples_per_s": 100.0 + seed, "peak_mem_bytes": 2**20 * (10 + seed),
        "overrides": [f"task={task}", f"attention={attention}", f"seed={seed}", *overrides],
        "config": {"tags": list(tags), "attention": {"name": attention}, **(config or {})}, **fields,
    }
    if status == "failed":
        record["error"] = "RuntimeError: boom"
    (run_dir / "results.json").write_text(json.dumps(record))
    return run_dir


def table_rows(text: str, task: str) -> tuple[list[str], list[dict]]:
    """Header and rows (as dicts) of one task's Markdown table; the attention cell filled in down its group."""
    lines = text.splitlines()
    start = lines.index(f"### {task}") + 2
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows, attention = [], None
    for line in lines[start + 2:]:
        if not line.startswith("| "):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        attention = cells[0] or attention
        rows.append(dict(zip(header, [attention, *cells[1:]])))
    return header, rows


def run_report(args: list[str], capsys) -> tuple[str, str]:
    assert report.main([str(arg) for arg in args]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_rows_are_settings_and_seeds_count_distinct_seeds(tmp_path, capsys):
    for i, (m, seed, acc) in enumerate([(32, 0, 0.40), (32, 1, 0.42), (128, 0, 0.50), (128, 1, 0.53), (128, 2, 0.56)]):
        write_run(tmp_path, f"{i}", "listops", "curformer", seed, acc,
                  overrides=[f"attention.num_landmarks={m}", "trainer.max_steps=10"])
    out, _ = run_report([tmp_path], capsys)
    header, rows = table_rows(out, "listops")
    assert header[:4] == ["attention", "setting", "seeds", "test %"] and len(header) <= 12
    by_setting = {row["setting"]: row for row in rows}
    assert by_setting["num_landmarks=32"]["seeds"] == "2" and by_setting["num_landmarks=128"]["seeds"] == "3"
    assert by_setting["num_landmarks=128"]["test %"] == "53.00 ± 3.00"  # sample std of 50, 53, 56
    assert by_setting["num_landmarks=32"]["test %"] == f"41.00 ± {math.sqrt(2.0):.2f}"
    assert "all rows: 10 steps." in out  # shared by every row: under the table, not in each cell


def test_setting_names_only_what_differs_from_the_plain_recipe(tmp_path, capsys):
    recipes = {
        "plain": [], "abs": ["attention.selection=abs"],  # abs is CURformer's default: the plain recipe too
        "sum": ["attention.selection=sum"],
        "rotary": ["model/positions=rotary", "pretrain.steps=2500"],
        "gpu": ["trainer=gpu", "logger=csv", "trainer.max_steps=3000", "optimizer.lr=1e-3", "task.eval_every=250"],
        "dropout": ["model.dropout=0", "attention.dropout=0"],
        "learned": ["model/positions=learned", "paths.cache_dir=/elsewhere",  # the default, a location, the console
                    "verbose=true", "callbacks.progress.refresh_rate=1"],
    }
    for seed, (name, overrides) in enumerate(recipes.items()):
        write_run(tmp_path, name, "listops", "curformer", seed, 0.36, overrides=overrides)
    out, _ = run_report([tmp_path], capsys)
    _, rows = table_rows(out, "listops")
    assert [row["setting"] for row in rows] == [
        "—", "attention.dropout=0 · model.dropout=0", "lr 1e-3 · 3,000 steps · GPU", "positions=rotary · pretrain 2,500",
        "selection=sum"]
    assert rows[0]["seeds"] == "3"  # plain, abs and learned: one setting, three seeds


def test_duplicate_runs_are_reported_once_the_newest(tmp_path, capsys):
    for copy, offset in (("first", 0.0), ("again", 0.01)):
        for seed in (0, 1):
            run_dir = write_run(tmp_path / copy, f"s{seed}", "listops", "softmax", seed, 0.30 + seed / 10 + offset)
            os.utime(run_dir / "results.json", (1e9 + (copy == "again"), 1e9 + (copy == "again")))
    out, err = run_report([tmp_path], capsys)
    _, (row,) = table_rows(out, "listops")
    assert row["seeds"] == "2" and row["test %"] == f"36.00 ± {100 * math.sqrt(0.005):.2f}"  # the newer copies
    for seed in (0, 1):
        assert (f"duplicate runs of listops / softmax / seed {seed}: {tmp_path / 'again' / f's{seed}'} and "
                f"{tmp_path / 'first' / f's{seed}'}; reporting the newest") in err


def test_unreadable_runs_are_skipped_with_the_file_and_the_reason(tmp_path, capsys):
    good = write_run(tmp_path, "good", "listops", "softmax", 0, 0.31)
    broken = {"garbage": None, "text": "abc", "percent": 25.2, "truncated": None}
    for name, acc in broken.items():
        write_run(tmp_path, name, "listops", "softmax", 1, acc)
    (tmp_path / "garbage" / "results.json").write_bytes(b"\xff\xfe\x00garbage")
    truncated = tmp_path / "truncated" / "results.json"
    truncated.write_text(truncated.read_text()[:40])
    empty = tmp_path / "empty_data"
    empty.mkdir()
    for name, status in (("no_data", "completed"), ("failed_no_data", "failed")):  # the cue has no data to read
        write_run(tmp_path, name, "listops", "curformer", 0, 0.2 if status == "completed" else None, status=status,
                  overrides=[f"task.data_dir={empty}"], config={"task": {"name": "listops", "data_dir": str(empty)}})
    out, err = run_report([tmp_path], capsys)
    assert f"skipped {tmp_path / 'garbage' / 'results.json'}: not UTF-8 text" in err
    assert f"skipped {tmp_path / 'text' / 'results.json'}: test_acc is 'abc'" in err
    assert (f"skipped {tmp_path / 'percent' / 'results.json'}: test_acc is 25.2: expected a fraction in [0, 1] "
            "(0.352 for 35.2 %)") in err
    assert f"skipped {truncated}: not valid JSON" in err
    _, rows = table_rows(out, "listops")
    softmax = next(row for row in rows if row["attention"] == "softmax")
    assert softmax["seeds"] == "1" and softmax["test %"] == "31.00"  # the good run only
    assert f"failed: listops / curformer / seed 0 in {tmp_path / 'failed_no_data'}" in out
    assert good.is_dir()


def test_comparability_checks_steps_batch_and_training_set_size(tmp_path, capsys):
    def run(name: str, steps: int, examples: int, batch: int, selection: str = "abs") -> None:
        write_run(tmp_path, name, "listops", "curformer", 0, 0.36, overrides=[f"attention.selection={selection}"],
                  steps=steps, train_examples=examples,
                  config={"attention": {"name": "curformer", "selection": selection},
                          "task": {"name": "listops", "batch_size": batch}, "trainer": {"devices": 1}})

    run("short", 20, 2000, 32, "sum")
    run("small_batch", 5000, 96000, 16, "embed")
    run("protocol", 5000, 96000, 32)
    out, _ = run_report([tmp_path], capsys)
    _, rows = table_rows(out, "listops")
    by_setting = {row["setting"]: row for row in rows}
    assert by_setting["—"]["published %"] == "39.62" and by_setting["—"]["Δ"] == "-3.62"
    assert by_setting["selection=sum"]["published %"].startswith("n.c. (") and by_setting["selection=sum"]["Δ"] == "-"
    assert "not comparable: 20 steps (CUR paper: 5,000), 2,000 training examples (96,000)." in out
    assert "not comparable: batch 16 (CUR paper: 32)." in out


def test_published_row_follows_tags_and_match(tmp_path):
    tables = yaml.safe_load(report.PUBLISHED.read_text())
    write_run(tmp_path, "a", "listops", "curformer", 0, 0.40, config={"attention": {"name": "curformer", "selection": "abs"}})
    write_run(tmp_path, "b", "listops", "curformer", 0, 0.41, config={"attention": {"name": "curformer", "selection": "sum"}},
              overrides=["attention.selection=sum"])
    write_run(tmp_path, "c", "text", "softmax", 0, 0.60, tags=["proxyformer_table1"], overrides=["experiment=proxyformer_table1"])
    write_run(tmp_path, "d", "text", "softmax", 0, 0.61)
    summary = report.summarize(report.group_runs(report.collect([tmp_path]))[0], tables)
    by_key = {(s["task"], s["label"]): s for s in summary}
    abs_row = by_key[("listops", "curformer")]
    assert (abs_row["published"], abs_row["published_table"]) == (39.62, "cur_table1")
    assert abs_row["delta"] == pytest.approx(40.0 - 39.62)
    sum_row = by_key[("listops", "curformer selection=sum")]
    assert (sum_row["published"], sum_row["published_table"]) == (38.99, "cur_table4_selection")
    assert by_key[("text", "softmax experiment proxyformer_table1")]["published"] == 64.84  # tagged: its own table
    # Untagged: the first table whose row is comparable. CUR Table 1 quotes Tay et al.'s original-size
    # Transformer (not comparable with our 2 x d64 one), so the Proxyformer paper's re-implementation wins.
    assert by_key[("text", "softmax")]["published"] == 64.84


def test_runs_not_completed_are_counted_and_listed(tmp_path, capsys):
    write_run(tmp_path, "ok", "listops", "softmax", 0, 0.30)
    write_run(tmp_path, "bad", "listops", "softmax", 1, None, status="failed")
    write_run(tmp_path, "stopped", "listops", "softmax", 3, None, status="interrupted")
    write_run(tmp_path, "later", "listops", "softmax", 4, None, status="not_started")
    killed = tmp_path / "killed" / ".hydra"
    killed.mkdir(parents=True)
    (killed / "config.yaml").write_text(yaml.safe_dump({"seed": 2, "task": {"name": "listops"}, "attention": {"name": "softmax"}}))
    (killed / "overrides.yaml").write_text(yaml.safe_dump(["seed=2"]))
    out, _ = run_report([tmp_path], capsys)
    _, (row,) = table_rows(out, "listops")
    assert row["seeds"] == "1 (1 failed, 1 interrupted, 2 missing)"  # missing: killed + not started
    assert "failed: listops / softmax / seed 1" in out and "RuntimeError: boom" in out
    assert "missing: listops / softmax / seed 2" in out
    assert "interrupted: listops / softmax / seed 3" in out and "not_started: listops / softmax / seed 4" in out


def test_markdown_latex_and_csv_are_one_table(tmp_path, capsys):
    for seed, acc in enumerate([0.2, 0.4]):
        write_run(tmp_path / "runs", f"s{seed}", "image", "softmax", seed, acc)
    write_run(tmp_path / "runs", "sum", "image", "curformer", 0, 0.3, overrides=["attention.selection=sum"])
    markdown, _ = run_report([tmp_path / "runs"], capsys)
    header, _ = table_rows(markdown, "image")
    latex, _ = run_report([tmp_path / "runs", "--format", "latex"], capsys)
    assert r"\toprule" in latex and r"\midrule" in latex and r"\bottomrule" in latex
    assert r"30.00 $\pm$ 14.14" in latex and r"selection=sum" in latex
    assert " & ".join(header).replace("%", r"\%").replace("Δ", r"$\Delta$") + r" \\" in latex
    out = tmp_path / "t.csv"
    assert report.main([str(tmp_path / "runs"), "--format", "csv", "--out", str(out)]) == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    expected = ["task", "attention", "setting", *(field for name in DEFAULT for field in COLUMNS[name].fields)]
    assert list(rows[0]) == expected
    softmax = next(row for row in rows if row["attention"] == "softmax")
    assert float(softmax["test_acc_mean"]) == pytest.approx(30.0) and float(softmax["published"]) == 38.57
    wide, _ = run_report([tmp_path / "runs", "--columns", "steps,best_val"], capsys)
    assert table_rows(wide, "image")[0][-1] == "best val %"  # steps: no row has them, left out of the table
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "runs"), "--columns", "speed"])
    assert "unknown column(s) speed" in capsys.readouterr().err


@pytest.mark.process
def test_empty_or_absent_dir_is_an_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith(f"[lra] FAILED: no readable runs (results.json or .hydra job dirs) "
                                              f"under {tmp_path}; give the dir of a run or sweep")
    proc = run_cli(["-m", "lra.analysis.report", str(tmp_path / "absent")])  # as typed: one line, no traceback
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"[lra] FAILED: not a directory: {tmp_path / 'absent'}; give run or sweep "
                                        "dirs (e.g. outputs/runs, outputs/multirun/<date_time.µs>, or docs/runs)"]


def test_published_file_is_consistent():
    tables = yaml.safe_load(report.PUBLISHED.read_text())
    for name, table in tables.items():
        assert table["source"], name
        for protocol in [table.get("protocol") or {}] + [row["protocol"] for row in table["rows"] if "protocol" in row]:
            assert set(protocol) <= set(table["tasks"]), name
            assert all(set(entry) <= {"steps", "batch_size", "train_examples"} for entry in protocol.values()), name
        for row in table["rows"]:
            assert len(row["acc"]) == len(table["tasks"]), (name, row["attention"])
            assert all(0 < value < 100 for value in row["acc"])


def test_the_committed_listops_runs_print_a_narrow_table_without_the_data(capsys):
    """docs/runs on a checkout without data/: ≤ 12 columns, the cue from the records, a baseline off chance."""
    out, _ = run_report([REPO_ROOT / "docs" / "runs"], capsys)
    header, rows = table_rows(out, "listops")
    assert len(header) <= 12 and header[1] == "setting" and "cue indep. %" in header
    assert {row["cue indep. %"] for row in rows if row["indep. test %"] != "-"} == {"35.92"}
    (baseline,) = [row for row in rows if row["p (McNemar)"] == "baseline"]
    assert baseline["setting"] == "—" and float(baseline["indep. test %"]) > 30  # plain recipe, off the plateau


def test_a_row_of_failed_runs_has_no_published_number_beside_it(tmp_path):
    """The published number stands beside our mean; a row without a completed run has none to compare."""
    tables = yaml.safe_load(report.PUBLISHED.read_text())
    for seed in (0, 1):
        write_run(tmp_path, f"failed{seed}", "listops", "curformer", seed, None, status="failed",
                  config={"attention": {"name": "curformer", "selection": "abs"}})
    (row,) = report.summarize(report.group_runs(report.collect([tmp_path]))[0], tables)
    assert row["failed"] == 2 and row["published"] is None and row["delta"] is None


def test_a_relative_dir_from_elsewhere_and_wandb_without_login_are_one_line(tmp_path, capsys, monkeypatch):
    """``lra-report docs/runs`` run from another dir names the checkout's dir; ``--wandb`` without a login says so in
    one line (no network is reached: W&B refuses before, lacking a key)."""
    monkeypatch.chdir(tmp_path)
    assert report.main(["docs/runs"]) == 1
    assert capsys.readouterr().err == (f"[lra] FAILED: not a directory: docs/runs; relative to {tmp_path}: the "
                                       f"checkout's is {REPO_ROOT / 'docs' / 'runs'}, give that\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    try:
        assert report.main(["--wandb", "someone/lra-attention"]) == 1
    finally:  # W&B's process-wide session (online, no key) would else refuse the offline runs of later tests
        import wandb

        wandb.teardown()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("[lra] FAILED: --wandb someone/lra-attention: could not read W&B runs") and "wandb login" in line


def test_forms_are_named_where_one_variants_rows_differ_in_them(tmp_path, capsys):
    """results.json's ``forms`` (what each attention op ran, :func:`attention.impl.model_forms`): CURformer's runs on the
    C++ kernels and in plain PyTorch are two rows that name their forms; softmax's runs, all alike, name none."""
    cpu = {"impl": "auto", "attention": "cpu", "pinv": "cpu", "selection": "cpu", "dropout": "cpu"}
    plain = {"impl": "pytorch", "attention": "pytorch", "pinv": "pytorch", "selection": "pytorch", "dropout": "cpu"}
    write_run(tmp_path, "a", "listops", "curformer", 0, 0.40, forms=cpu)
    write_run(tmp_path, "b", "listops", "curformer", 0, 0.41, overrides=["attention.impl=pytorch"], forms=plain)
    for seed in (0, 1):
        write_run(tmp_path, f"s{seed}", "listops", "softmax", seed, 0.38,
                  forms={"impl": "auto", "attention": "pytorch", "dropout": "cpu"})
    out, _ = run_report([tmp_path], capsys)
    _, rows = table_rows(out, "listops")
    settings = {(row["attention"], row["setting"]) for row in rows}
    assert ("curformer", "forms attention=cpu pinv=cpu selection=cpu dropout=cpu") in settings
    assert any(attention == "curformer" and "forms attention=pytorch" in setting for attention, setting in settings)
    assert ("softmax", "—") in settings
