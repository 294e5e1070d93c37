"""FlashCUR: config, clear errors, tile sizes, and — through subprocesses with ``TRITON_INTERPRET=1`` —
the kernels against CUR (``tests/test_flashcur_kernels.py``) and a few training steps against curformer.

Why subprocesses: Triton picks the interpreter when a kernel is *defined*, from the environment at
that moment, so it cannot be switched on for one test inside a pytest process other tests share.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
import torch

import attention.flashcur  # noqa: F401  (defines the kernels now, from this process's environment)
from kernels.flashcur.launch import block_sizes
from lra.module import build_attention
from tests.conftest import compose_config, run_cli

INTERPRETER_ENV = {"TRITON_INTERPRET": "1"}


def test_kernels_under_the_interpreter():
    """Forward ≤ 1e-4 and gradients ≤ 1e-3 (relative) vs CUR on tiny shapes, kernels one by one, saved bytes."""
    proc = run_cli(
        ["-m", "pytest", "tests/test_flashcur_kernels.py", "-q", "-s", "-m", "not slow", "-p", "no:cacheprovider"],
        env=INTERPRETER_ENV,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


@pytest.mark.slow
def test_kernel_sweep_under_the_interpreter():
    """Larger n, head dims up to 128, m up to 128 (and 48, padded), every selection rule, fp16/bf16."""
    proc = run_cli(
        ["-m", "pytest", "tests/test_flashcur_kernels.py", "-q", "-s", "-m", "slow", "-p", "no:cacheprovider"],
        env=INTERPRETER_ENV,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def train_losses(run_dir: Path) -> list[float]:
    """``train/loss`` per step from the CSV logger of one ``lra.train`` run."""
    (metrics,) = run_dir.glob("csv/version_*/metrics.csv")
    with metrics.open() as handle:
        return [float(row["train/loss"]) for row in csv.DictReader(handle) if row.get("train/loss")]


def test_training_matches_curformer_under_the_interpreter(tiny_listops_overrides, tmp_path):
    """Three optimiser steps on tiny ListOps: flashcur (interpreted kernels) and curformer log the same losses."""
    shared = [
        *tiny_listops_overrides,
        "task.max_length=64",
        "task.batch_size=8",
        "trainer.max_steps=3",
        "task.eval_every=3",
        "trainer.log_every_n_steps=1",
        "+trainer.limit_val_batches=1",
        "+trainer.limit_test_batches=1",
        "attention.num_landmarks=16",
    ]
    losses = {}
    for name, env in (("curformer", None), ("flashcur", INTERPRETER_ENV)):
        run_dir = tmp_path / name
        proc = run_cli(["-m", "lra.train", *shared, f"attention={name}", f"hydra.run.dir={run_dir}"], env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        losses[name] = train_losses(run_dir)
    print(f"train/loss curformer {losses['curformer']}, flashcur {losses['flashcur']}")
    assert len(losses["flashcur"]) == 3
    assert losses["flashcur"] == pytest.approx(losses["curformer"], abs=1e-4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_or_interpreter_the_error_says_so(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cfg = compose_config(["attention=flashcur"])
    with pytest.raises(RuntimeError, match="needs a CUDA GPU or the Triton interpreter.*attention=curformer"):
        build_attention(cfg.attention, num_heads=2, head_dim=32)


@pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1", reason="kernels can run here")
def test_cpu_tensors_without_interpreted_kernels_are_refused(monkeypatch):
    """TRITON_INTERPRET=1 set after the kernels were defined (at this file's import): a clear refusal."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    attn = build_attention(compose_config(["attention=flashcur"]).attention, num_heads=2, head_dim=32)
    q = torch.randn(1, 2, 20, 32)
    with pytest.raises(RuntimeError, match="imported without TRITON_INTERPRET=1"):
        attn(q, q, q, torch.ones(1, 20, dtype=torch.bool))


@pytest.mark.parametrize(
    ("override", "head_dim", "message"),
    [
        ("attention.num_landmarks=256", 32, "at most 128 selected rows"),
        ("attention.num_landmarks=64", 8, "head_dim 16..128"),
        ("attention.selection=nope", 32, "attention.selection='nope'"),
    ],
)
def test_config_errors_name_the_key(monkeypatch, override, head_dim, message):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # pass the device check; these are config errors
    cfg = compose_config(["attention=flashcur", override])
    with pytest.raises(ValueError, match=message):
        build_attention(cfg.attention, num_heads=2, head_dim=head_dim)


def test_config_mirrors_curformer_defaults():
    flash = compose_config(["attention=flashcur"]).attention
    cur = compose_config(["attention=curformer"]).attention
    shared = set(flash) - {"name", "_target_"}
    assert shared == set(cur) - {"name", "_target_", "score"}
    assert {key: flash[key] for key in shared} == {key: cur[key] for key in shared}


@pytest.mark.parametrize("n", [1, 15, 16, 17, 100, 4096])
@pytest.mark.parametrize("m", [16, 32, 64, 128])
@pytest.mark.parametrize("d", [16, 24, 64, 100, 128])
def test_tiles_are_powers_of_two_and_dot_safe(n, m, d):
    """Every tl.dot operand dimension is a tile size, ≥ 16 (GPU minimum) and a power of two."""
    sizes = block_sizes(n, m, d)
    for size in (*sizes.values(), m):
        assert size >= 16 and size & (size - 1) == 0
    assert m % sizes["BLOCK_M"] == 0 and sizes["BLOCK_D"] >= d
