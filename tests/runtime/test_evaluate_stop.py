"""Ctrl-C during ``lra.evaluate``: the test batch in flight ends, ``results.json`` records ``status: interrupted``
and one ``[lra] INTERRUPTED`` line says so, exit 130 (lra/evaluate.py)."""

from __future__ import annotations

import json
import signal

import pytest

from tests.conftest import run_cli, run_in_process


@pytest.mark.process
def test_ctrl_c_during_an_evaluation_leaves_a_record_and_one_line(tiny_listops_overrides, tmp_path):
    trained = tmp_path / "trained"
    assert run_in_process(["-m", "lra.train", *tiny_listops_overrides, f"hydra.run.dir={trained}"]).returncode == 0
    checkpoint = json.loads((trained / "results.json").read_text())["best_checkpoint"]
    run_dir = tmp_path / "evaluation"
    stopped = run_cli(["-m", "lra.evaluate", *tiny_listops_overrides, f"ckpt_path={checkpoint}",
                       "+callbacks.faults._target_=tests.faults.Faults", f"hydra.run.dir={run_dir}"],
                      env={"LRA_FAULT_SIGINT_IN_TEST_AT": "0"})
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr[-3000:]
    assert stopped.stderr.strip().splitlines()[-1].startswith(
        f"[lra] INTERRUPTED by SIGINT (Ctrl-C) during the evaluation: {run_dir / 'results.json'} records it")
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "interrupted" and record["transferred_from"] == checkpoint
    assert "Traceback" not in stopped.stdout + stopped.stderr
