"""Shared fixtures: compose the real Hydra config, run the real CLI, tiny generated ListOps data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

from attention import paths
from lra import REPO_ROOT
from lra.tasks import listops

CONFIG_DIR = str(REPO_ROOT / "configs")


def pytest_report_header(config) -> str:
    """Which ATen kernels ran (ATEN_CPU_CAPABILITY picks them; ``make test-numerics ISA=...``)."""
    return f"torch {torch.__version__}, ATen CPU capability {torch.backends.cpu.get_cpu_capability()}"


def compose_config(overrides: list[str], output_dir: Path | str | None = None) -> DictConfig:
    """``configs/train.yaml`` composed with ``overrides``; ``paths.output_dir`` set (no Hydra runtime here)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    if output_dir is not None:
        with open_dict(cfg):
            cfg.paths.output_dir = str(output_dir)
    return cfg


@pytest.fixture(params=["cpu_forms", "fused_forms"])
def landmark_forms(request, monkeypatch) -> str:
    """Runs a test on the CPU forms of the landmark attention, then on the fused forms that other devices run
    (:data:`attention.paths.FUSED_ON_CPU`): both against the same references."""
    monkeypatch.setattr(paths, "FUSED_ON_CPU", request.param == "fused_forms")
    return request.param


def run_cli(args: list[str], cwd: Path | None = None, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python <args>`` as a user would (real Hydra, Lightning, W&B offline); stdout+stderr captured."""
    # One thread: tiny models gain nothing from more, and test processes share 2 cores.
    environment = {**os.environ, "WANDB_SILENT": "true", "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd or REPO_ROOT, capture_output=True, text=True, timeout=timeout, env=environment
    )


@pytest.fixture(scope="session")
def tiny_listops(tmp_path_factory) -> Path:
    """A tiny ListOps copy in the official format (64/32/32 examples, lengths 10-60)."""
    out = tmp_path_factory.mktemp("listops")
    listops.generate(out, {"train": 64, "val": 32, "test": 32}, seed=0, min_length=10, max_length=60)
    return out


@pytest.fixture
def tiny_listops_overrides(tiny_listops, tmp_path) -> list[str]:
    """Overrides that train ``listops_small`` on the tiny copy for a few steps, caching under ``tmp_path``."""
    return [
        "task=listops_small",
        f"task.data_dir={tiny_listops}",
        f"paths.cache_dir={tmp_path / 'cache'}",
        "task.batch_size=16",
        "task.warmup_steps=2",
        "trainer.max_steps=4",
        "task.eval_every=2",
        "logger=csv",
    ]


@pytest.fixture
def exact_float32_matmuls():
    """Plain float32 matmuls on a GPU (no TF32) while a test runs, like the Triton kernels' ``ieee`` dots and
    the tolerances the kernel tests assume; restored afterwards."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved
