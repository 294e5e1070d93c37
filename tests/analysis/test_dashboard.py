"""The W&B record of a run and the dashboard built on it: real short offline runs, read back with wandb's own
offline-run reader (``wandb leet inspect``); the dashboard spec built offline and its keys checked against them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lra.analysis.comparability import PUBLISHED
from lra.analysis.dashboard import build_report, build_spec, build_views, published_rows, used_keys
from lra.analysis.report import collect, group_runs
from lra.runtime.interrupts import SIGTERM_EXIT_CODE
from lra.tasks import listops_generator
from lra.runtime.wandb_summary import GROUP_KEYS, group_keys, summary_fields
from tests.conftest import REPO_ROOT, compose_config, run_cli, run_in_process

FAULTS = "+callbacks.faults._target_=tests.faults.Faults"  # tests/faults.py; the fault is chosen by LRA_FAULT_*
GROUP = "dashboard-test"
RECORD_KEYS = {"test/acc", "val/acc_best", "independent_test/acc", "perf/samples_per_s", "perf/peak_mem_bytes",
               "perf/peak_mem_measure", "steps", "train_time_s", "status", "git_commit"}
NO_NETWORK = {"WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_MODE": "offline"}  # any W&B request fails at once


def wandb_leet(*args: str) -> str:
    """``wandb leet inspect ...`` of the pinned wandb: its reader of a run's ``.wandb`` transaction log."""
    command = [str(Path(sys.executable).with_name("wandb")), "leet", "inspect", *args]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=300).stdout


def offline_run(run_dir: Path) -> dict:
    """The run's summary, config and group as wandb reads them from ``<run dir>/wandb/offline-run-*``."""
    [path] = run_dir.glob("wandb/offline-run-*")
    state = json.loads(wandb_leet("--summary", "--json", str(path)))
    records = [json.loads(line) for line in wandb_leet("--json", str(path)).splitlines() if line.strip()]
    [run] = [record["run"] for record in records if record["type"] == "run"]
    return {"summary": state["summary"], "config": state["config"], "group": run.get("run_group")}


def train(data: Path, run_dir: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """A short curformer run on tiny ListOps, logged to W&B offline in group :data:`GROUP`: in a process of its own
    when a signal stops it (``env``: ``LRA_FAULT_SIG*``), else in this one."""
    signalled = any(key.startswith("LRA_FAULT_SIG") for key in env or {})
    return (run_cli if signalled else run_in_process)(
        ["-m", "lra.train", "task=listops_small", f"task.data_dir={data}", f"paths.cache_dir={run_dir.parent / 'cache'}",
         "task.batch_size=16", "task.warmup_steps=2", "trainer.max_steps=4", "task.eval_every=2", "attention=curformer",
         "attention.num_landmarks=8", "logger=wandb", f"group={GROUP}", f"hydra.run.dir={run_dir}", *extra], env=env)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Tiny ListOps with an independent test split, so the run logs ``independent_test/acc`` too."""
    out = tmp_path_factory.mktemp("listops_independent")
    listops_generator.generate(out, {"train": 64, "val": 32, "test": 32, "independent_test": 32}, seed=0, min_length=10,
                     max_length=60)
    return out


@pytest.fixture(scope="module")
def completed(data, tmp_path_factory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("completed") / "run"
    proc = train(data, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, offline_run(run_dir)


def assert_summary_holds_the_record(summary: dict, record: dict) -> None:
    """Every scalar of results.json is in the summary, under its stable name, with the same value."""
    expected = summary_fields(record)
    assert expected, record
    assert {key: summary.get(key) for key in expected} == expected


def test_a_short_offline_run_has_its_record_in_the_summary_and_flat_config_keys(completed):
    run_dir, run = completed
    record = json.loads((run_dir / "results.json").read_text())
    assert RECORD_KEYS <= run["summary"].keys(), sorted(run["summary"])
    assert_summary_holds_the_record(run["summary"], record)
    assert run["summary"]["status"] == "completed" and run["summary"]["steps"] == 4
    assert run["summary"]["perf/samples_per_s"] > 0 and run["summary"]["perf/peak_mem_bytes"] > 0
    assert run["summary"]["perf/peak_mem_measure"] == "process_peak_rss"  # a CPU run
    assert run["summary"]["git_commit"] == record["git_commit"] and record["git_commit"]
    flat = {key: run["config"][key] for key in GROUP_KEYS}
    assert flat == {"attention": "curformer", "task": "listops_small", "seed": 0, "num_landmarks": 8,
                    "selection": "abs", "positions": "learned"}
    assert run["config"]["config"]["model"]["d_model"] == record["config"]["model"]["d_model"]  # the whole config
    assert run["group"] == GROUP


@pytest.mark.parametrize(("overrides", "positions"), [([], "learned"), (["model/positions=rotary"], "rotary"),
                                                      (["experiment=mega_lra", "task=listops"], "none")])
def test_positions_say_how_the_model_is_given_token_order(overrides, positions):
    assert group_keys(compose_config(overrides))["positions"] == positions


@pytest.mark.parametrize(("fault", "status", "returncode"), [
    # SIGTERM: slow (a process of its own, ~40 s); the summary path is ENOSPC's, an interruption's record lra.runtime's tests'
    pytest.param("SIGTERM", "interrupted", SIGTERM_EXIT_CODE, marks=[pytest.mark.process, pytest.mark.slow]),
    ("ENOSPC", "failed", 1)])
def test_failed_and_interrupted_runs_have_their_record_in_the_summary(data, tmp_path, fault, status, returncode):
    run_dir = tmp_path / "run"
    proc = train(data, run_dir, FAULTS, env={f"LRA_FAULT_{fault}_AT": "3"})
    assert proc.returncode == returncode, proc.stderr[-3000:]
    record = json.loads((run_dir / "results.json").read_text())
    summary = offline_run(run_dir)["summary"]
    assert_summary_holds_the_record(summary, record)
    assert summary["status"] == status and summary["error"] == record["error"]
    assert {"steps", "perf/peak_mem_bytes", "git_commit"} <= summary.keys()


def test_every_key_of_the_dashboard_is_one_training_logs(completed):
    """Panels, filters, grouping and table columns of the workspace views and the report, for ListOps (with its
    independent test) and the run's own task, against what the real run put in W&B."""
    _, run = completed
    spec = build_spec("entity", "lra-attention", GROUP, ["listops", "listops_small"], [], {})
    keys = used_keys(spec)
    assert {"val/acc", "test/acc", "perf/samples_per_s", "perf/peak_mem_bytes", "independent_test/acc"} <= keys["summary"]
    assert keys["summary"] - run["summary"].keys() == set()
    assert keys["config"] - run["config"].keys() == set()
    assert keys["run"] == {"group"} and run["group"] == GROUP


def test_the_wandb_workspaces_objects_are_built_offline_from_the_spec():
    spec = build_spec("entity", "lra-attention", GROUP, ["listops"], [], yaml.safe_load(PUBLISHED.read_text()))
    [view] = build_views(spec)
    model = json.loads(view._to_model().model_dump_json())  # the view as it would be saved (no network)
    panels = [panel["config"] for section in model["spec"]["section"]["panel_bank_config"]["sections"]
              for panel in section["panels"]]
    assert [section["name"] for section in model["spec"]["section"]["panel_bank_config"]["sections"]] == [
        "Learning curves", "Test accuracy", "Speed vs accuracy", "Peak memory"]
    plotted = {metric for panel in panels for metric in panel.get("metrics") or []}
    assert plotted == {"val/acc", "train/loss", "test/acc", "independent_test/acc", "perf/peak_mem_bytes"}
    assert {"x_axis": "summary:perf/samples_per_s", "y_axis": "summary:test/acc"}.items() <= panels[4].items()
    assert {panel.get("group_by") for panel in panels} == {"attention.value", None}
    report = build_report(spec)
    markdown = [block.text for block in report.blocks if type(block).__name__ == "MarkdownBlock"]
    assert "| curformer attention.selection=abs |  | 39.62 ± 0.62 | cur_table1 |" in markdown[0]


def test_published_numbers_are_the_reports_for_the_same_runs():
    """The recorded ListOps runs (docs/runs) get the published number lra.analysis.report sets beside them."""
    rows, _ = group_runs(collect([REPO_ROOT / "docs" / "runs"]))
    published = {entry["row"]: (entry["acc"], entry["table"])
                 for entry in published_rows("listops", rows, yaml.safe_load(PUBLISHED.read_text()))}
    assert published["curformer"] == (39.62, "cur_table1")                          # Abs selection, Table 1
    assert published["curformer selection=sum"] == (38.99, "cur_table4_selection")
    assert published["nystromformer"] == (37.15, "cur_table1")


@pytest.mark.process
def test_dry_run_prints_the_spec_without_network(completed):
    run_dir, run = completed
    proc = run_cli(["-m", "lra.analysis.dashboard", "entity/lra-attention", "--group", GROUP, "--runs", str(run_dir),
                    "--dry-run"], env=NO_NETWORK)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spec = json.loads(proc.stdout)
    assert [view["name"] for view in spec["workspaces"]] == [f"group {GROUP}: listops_small"]
    assert [section["task"] for section in spec["report"]["sections"]] == ["listops_small"]
    [published] = spec["report"]["sections"][0]["published"]
    assert published["row"] == "curformer" and published["runs"] == 1 and published["note"] == "no published row"
    assert used_keys(spec)["summary"] - run["summary"].keys() == set()


def test_a_project_path_without_entity_is_refused(capsys):
    from lra.analysis.dashboard import main

    with pytest.raises(SystemExit):
        main(["lra-attention", "--dry-run"])
    assert "expected ENTITY/PROJECT" in capsys.readouterr().err


def test_a_missing_runs_dir_runs_without_wandb_data_and_no_login_are_one_line_each(tmp_path, capsys, monkeypatch):
    """``--runs`` naming no dir; a dry run over runs that logged no W&B data (``logger=csv``) says they will not
    show; saving without a login (no network is reached: W&B refuses first) ends in one line, not a traceback."""
    from lra.analysis.dashboard import main
    from tests.analysis.test_report import write_run

    assert main(["entity/lra-attention", "--runs", str(tmp_path / "absent"), "--dry-run"]) == 1
    assert capsys.readouterr().err == (f"[lra] FAILED: --runs: not a directory: {tmp_path / 'absent'}; give run or "
                                       f"sweep dirs of lra.train (e.g. outputs/runs, outputs/multirun/<date_time.µs>)\n")
    run_dir = write_run(tmp_path / "runs", "csv_only", "listops", "softmax", 0, 0.3)
    assert main(["entity/lra-attention", "--runs", str(tmp_path / "runs"), "--dry-run"]) == 0
    note = f"[lra] note: 1 of 1 runs under --runs have no W&B data (no <run dir>/wandb/: logger=csv or none), e.g. {run_dir}"
    assert capsys.readouterr().err.startswith(note)
    for key, value in {**NO_NETWORK, "HOME": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert main(["entity/lra-attention", "--runs", str(tmp_path / "runs")]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("[lra] FAILED: saving the workspace views and report to W&B (") and "wandb login" in last
