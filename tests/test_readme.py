"""The README's quick start works as pasted, in a fresh shell after ``make train`` (``.venv`` made and installed)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from lra import REPO_ROOT


def quick_start() -> list[str]:
    """The commands of the first ``bash`` block under "## Quick start", comments dropped."""
    section = (REPO_ROOT / "README.md").read_text().split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].rstrip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


@pytest.mark.process
@pytest.mark.skipif(not (REPO_ROOT / ".venv" / "bin" / "activate").is_file(), reason="no .venv: `make setup` makes it")
def test_the_quick_start_runs_in_a_fresh_shell(tiny_listops, tmp_path):
    """Each line as written, in one ``bash`` with a bare environment (no venv active, no PYTHONPATH). Only the output
    and data places and the step count are added to the training commands (``trainer.max_steps=2`` on the tiny
    ListOps copy, outputs under ``tmp_path``), and the report reads those outputs."""
    commands = quick_start()
    assert commands[0] == "source .venv/bin/activate"  # before the first python -m line
    logs = tmp_path / "logs"
    tiny = (f"trainer.max_steps=2 task.eval_every=2 task.warmup_steps=1 task.batch_size=16 task.data_dir={tiny_listops} "
            f"paths.cache_dir={tmp_path / 'cache'} paths.log_dir={logs} logger=csv")
    script = ["set -e"]
    for command in commands:
        if command.startswith("python -m lra.train") and "--cfg" not in command:
            command = f"{command} {tiny}"
        script.append(command.replace(" outputs/", f" {logs}/"))
    bare = {"HOME": os.environ.get("HOME", str(tmp_path)), "PATH": "/usr/local/bin:/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=REPO_ROOT, env=bare, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "[lra] test acc" in proc.stdout and "name: curformer" in proc.stdout  # the run, then its config
    assert "### listops_small" in proc.stdout and "curformer" in proc.stdout.split("### listops_small", 1)[1]
