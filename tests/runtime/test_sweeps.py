"""Multirun sweeps through the real CLI: joblib in parallel, the report of a 2 x 2 sweep, failed jobs,
sweeps naming configs that do not exist, every experiment config, submitit_local (slow)."""

from __future__ import annotations

import json

import pytest
import yaml
from hydra import compose, initialize_config_dir

from lra import REPO_ROOT
from lra.analysis import report
from lra.runtime.hydra_callbacks import missing_options
from lra.runtime.sweep_console import summary
from tests.conftest import CONFIG_DIR, run_cli, run_in_process
from tests.console_output import sweep_table

EXPERIMENTS = sorted(path.stem for path in (REPO_ROOT / "configs" / "experiment").glob("*.yaml"))


@pytest.fixture
def second_attention(tmp_path) -> list[str]:
    """A second attention config (softmax without attention dropout, name ``softmax_b``) on a search path,
    so the 2 x 2 sweep does not depend on which variants other work has added."""
    extra = tmp_path / "extra_configs" / "attention"
    extra.mkdir(parents=True)
    node = yaml.safe_load((REPO_ROOT / "configs" / "attention" / "softmax.yaml").read_text())
    (extra / "softmax_b.yaml").write_text(yaml.safe_dump({**node, "name": "softmax_b", "dropout": 0.0}))
    return [f"hydra.searchpath=[file://{extra.parent}]"]


@pytest.mark.process
def test_joblib_2x2_sweep_runs_in_parallel_and_reports(tiny_listops_overrides, second_attention, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(["-m", "lra.train", "-m", *tiny_listops_overrides, *second_attention, "attention=softmax,softmax_b",
                    "seed=0,1", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "validated against ConfigStore schema" not in proc.stderr  # filtered in lra/__init__.py, workers too
    results = sorted(sweep.rglob("results.json"))
    assert len(results) == 4
    records = [json.loads(path.read_text()) for path in results]
    assert {(r["attention"], r["seed"], r["status"]) for r in records} == {
        (a, s, "completed") for a in ("softmax", "softmax_b") for s in (0, 1)}
    assert {r["config"]["group"] for r in records} == {"sweep"}  # W&B group = sweep dir name
    # joblib ran jobs concurrently: some two jobs' [start, end] intervals overlap (start: Hydra writes
    # .hydra/config.yaml before the job function runs; end: results.json is written last).
    spans = sorted((path.parent.joinpath(".hydra", "config.yaml").stat().st_mtime, path.stat().st_mtime) for path in results)
    assert any(start_b < end_a for (_, end_a), (start_b, _) in zip(spans, spans[1:])), spans
    # Each job, in its worker process, says which it is; the sweep ends with one table of its jobs in their order.
    jobs = [("softmax", 0), ("softmax", 1), ("softmax_b", 0), ("softmax_b", 1)]  # the basic sweeper's order
    for k, (attention, seed) in enumerate(jobs, start=1):
        assert f"[lra] job {k} of 4: attention={attention} seed={seed}" in proc.stdout
    first, rows = sweep_table(proc.stdout, sweep)
    assert first == f"[lra] sweep {sweep}: 4 jobs, 4 completed"
    assert [(row["job"], row["attention"], row["seed"]) for row in rows] == [(str(k), a, str(s)) for k, (a, s) in
                                                                            enumerate(jobs, start=1)]
    for row in rows:
        record = json.loads((sweep / row["run dir"] / "results.json").read_text())
        assert (record["attention"], str(record["seed"])) == (row["attention"], row["seed"])
        assert row["status"] == "completed" and row["test acc"] == f"{record['test_acc']:.4f}"

    published = tmp_path / "published.yaml"
    published.write_text(yaml.safe_dump({"demo": {"source": "test table", "tasks": ["listops_small"], "rows": [
        {"attention": "softmax_b", "acc": [11.0]}, {"attention": "softmax", "acc": [22.0]}]}}))
    out = tmp_path / "report.csv"
    assert report.main([str(sweep), "--format", "csv", "--published", str(published), "--out", str(out)]) == 0
    rows = {row["attention"]: row for row in __import__("csv").DictReader(out.open())}
    assert set(rows) == {"softmax", "softmax_b"}  # seed and identical overrides do not split rows
    for attention, expected_published in (("softmax", 22.0), ("softmax_b", 11.0)):
        accs = [100 * r["test_acc"] for r in records if r["attention"] == attention]
        row = rows[attention]
        assert int(row["seeds"]) == 2 and int(row["failed"]) == 0
        assert float(row["test_acc_mean"]) == pytest.approx(sum(accs) / 2)
        assert float(row["test_acc_std"]) == pytest.approx(abs(accs[0] - accs[1]) / 2 ** 0.5)
        assert float(row["published"]) == expected_published
        assert float(row["delta"]) == pytest.approx(sum(accs) / 2 - expected_published)


def test_failed_job_is_reported_and_fails_the_sweep(tiny_listops_overrides, tmp_path):
    sweep = tmp_path / "sweep"
    # trainer.max_steps=0 makes the second job fail in lra.train's validation, the first trains.
    proc = run_in_process(["-m", "lra.train", "-m", *tiny_listops_overrides, "trainer.max_steps=4,0",
                           f"hydra.sweep.dir={sweep}"])
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "1 job(s) of the sweep" in proc.stderr and "trainer.max_steps must be an integer >= 1" in proc.stderr
    first, rows = sweep_table(proc.stdout, sweep)  # printed before the failures are named
    assert first == f"[lra] sweep {sweep}: 2 jobs, 1 completed, 1 failed"
    assert [(row["trainer.max_steps"], row["status"], row["test acc"] != "-") for row in rows] == [
        ("4", "completed", True), ("0", "failed", False)]
    out = tmp_path / "report.md"
    assert report.main([str(sweep), "--out", str(out)]) == 0
    text = out.read_text()
    header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    assert text.startswith("### listops_small")  # one table per task, one row per setting, the failure in its row
    assert header[:3] == ["attention", "setting", "seeds"]
    assert sorted(row[1:3] for row in rows) == [["0 steps", "0 (1 failed)"], ["4 steps", "1"]]
    assert "1 run(s) not completed" in text and "failed: listops_small / softmax / seed 0" in text


def test_sweep_naming_a_missing_config_stops_before_any_job(tiny_listops_overrides, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_in_process(["-m", "lra.train", "-m", *tiny_listops_overrides, "attention=softmax,not_a_variant",
                           f"hydra.sweep.dir={sweep}"])
    assert proc.returncode == 1
    assert "attention=not_a_variant: no config 'configs/attention/not_a_variant.yaml'" in proc.stderr
    assert not list(sweep.rglob("results.json"))  # the softmax job did not start either


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_config_composes(experiment):
    """Composes; each swept config-group option exists, or the message names it."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        # task=listops: an experiment sweeps LRA tasks (mega_lra's protocol exists for those, not for listops_small)
        cfg = compose(config_name="train", overrides=[f"experiment={experiment}", "task=listops"], return_hydra_config=True)
        from lra.runtime.hydra_callbacks import hydra_group_options, sweep_overrides

        problems = missing_options(sweep_overrides(cfg), hydra_group_options(cfg))
    assert cfg.tags, f"{experiment} should tag its runs with its table"
    for problem in problems:  # a variant or task another issue has not landed yet
        assert "no config 'configs/" in problem and "Available:" in problem


def test_experiment_cfg_job_on_the_command_line():
    proc = run_in_process(["-m", "lra.train", "experiment=cur_table1", "--cfg", "job"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert yaml.safe_load(proc.stdout)["tags"] == ["cur_table1"]


def test_missing_options_reads_sweeps_and_ignores_plain_values():
    options = {"attention": ["softmax", "curformer"], "task": ["listops"]}
    problems = missing_options(["attention=softmax,nope", "task=listops", "seed=0,1", "attention.lam=1,2"],
                               lambda group: options.get(group, []))
    assert len(problems) == 1 and problems[0].startswith("attention=nope:") and "attention=softmax" in problems[0]


@pytest.mark.process
@pytest.mark.slow
def test_submitit_local_runs_a_job(tiny_listops_overrides, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(["-m", "lra.train", "-m", *tiny_listops_overrides, "hydra/launcher=submitit_local",
                    "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={sweep}"], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = sweep.rglob("results.json")
    assert json.loads(result.read_text())["status"] == "completed"
    assert list((sweep / ".submitit").rglob("*_log.out"))  # ran through submitit


def test_sweep_summary_names_a_job_without_a_record(tmp_path):
    """A job killed outright leaves no results.json: its row says so instead of vanishing from the table."""
    (tmp_path / "0_run").mkdir()
    (tmp_path / "0_run" / "results.json").write_text(json.dumps({"overrides": ["seed=0", "task=t"], "status": "completed",
                                                                 "test_acc": 0.25}))
    first, *table = summary(tmp_path, [["task=t", "seed=0"], ["task=t", "seed=1"]])
    assert first == f"[lra] sweep {tmp_path}: 2 jobs, 1 completed, 1 missing"
    assert [[cell.strip() for cell in line.strip("|").split("|")] for line in table[2:]] == [
        ["1", "0", "completed", "0.2500", "0_run"], ["2", "1", "missing", "-", "-"]]
    assert [cell.strip() for cell in table[0].strip("|").split("|")] == ["job", "seed", "status", "test acc", "run dir"]
