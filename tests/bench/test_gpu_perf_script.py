"""scripts/gpu_perf.sh at tiny sizes on the CPU (GPU_PERF_SMOKE=1): every step's command runs as written and writes
its CSV, so the prepared GPU run does not fail on a typo when a GPU is finally at hand."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lra import REPO_ROOT


def run_script(part: str, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPU_PERF_SMOKE": "1", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "WANDB_SILENT": "true", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu_perf.sh"), part, str(out)], env=env,
                          capture_output=True, text=True, timeout=1800)


@pytest.mark.process
@pytest.mark.slow
def test_speed_part_runs_every_step_on_the_cpu(tmp_path):
    result = run_script("speed", tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert result.returncode == 0, summary
    for step in ("launches", "plan", "pinv", "rows", "attention", "attention_fig4", "profile", "train_text", "train_listops"):
        assert f"## {step}: ok" in summary
    assert "curformer: one layer, B 8" in (tmp_path / "plan.log").read_text()  # the plan, as on the GPU
    profile = (tmp_path / "profile.log").read_text()  # the kernel profile (operators on the CPU), FlashCUR skipped
    for phase in ("core/softmax n=64 forward", "core/curformer n=64 backward", "core/nystromformer n=64 forward"):
        assert phase in profile
    assert "flashcur skipped" in profile
    assert summary.splitlines()[2].startswith("machine: ")
    rows = list(csv.DictReader((tmp_path / "train_text" / "train.csv").open()))
    assert [row["variant"] for row in rows] == ["softmax", "softmax_materialised", "curformer", "flashcur", "nystromformer"]
    assert float(rows[2]["speed_vs_transformer"]) > 0


@pytest.mark.process
def test_a_wrong_part_is_refused_with_the_usage(tmp_path):
    result = run_script("fast", tmp_path)
    assert result.returncode == 2 and "usage: scripts/gpu_perf.sh [speed|compiled]" in result.stderr
