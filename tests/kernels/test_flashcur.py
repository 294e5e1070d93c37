"""FlashCUR: config, clear errors, tile sizes, the launch plan and FLOP count of a GPU step (on ``meta`` tensors),
and — through subprocesses with ``TRITON_INTERPRET=1`` — the kernels against CUR (``tests/kernels/test_flashcur_kernels.py``)
and a few training steps against curformer.

Why subprocesses: Triton picks the interpreter when a kernel is *defined*, from the environment at
that moment, so it cannot be switched on for one test inside a pytest process other tests share. They hide
CUDA (``CUDA_VISIBLE_DEVICES=""``), so on a machine with a GPU they run the interpreter on CPU tensors
exactly as on one without (``tests/triton_env.py`` picks CUDA when it is visible).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attention.flashcur  # noqa: F401  (defines the kernels now, from this process's environment)
from kernels.common.launch import recording
from kernels.cur import launch as kernel_launch
from kernels.cur import run as kernel_run
from kernels.cur import ops
from kernels.cur.launch import block_sizes
from kernels.segment_means import launch as landmark_launch
from lra.build import build_attention
from tests.conftest import compose_config, run_cli

CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}  # the subprocesses run on CPU tensors, with or without a GPU here
INTERPRETER_ENV = {"TRITON_INTERPRET": "1", **CPU_ONLY}


def test_kernels_under_the_interpreter():
    """Forward ≤ 1e-4 and gradients ≤ 1e-3 (relative) vs CUR on tiny shapes, kernels one by one, saved bytes."""
    proc = run_cli(
        ["-m", "pytest", "tests/kernels/test_flashcur_kernels.py", "-q", "-s", "-m", "not slow", "-p", "no:cacheprovider"],
        env=INTERPRETER_ENV,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


@pytest.mark.slow
def test_kernel_sweep_under_the_interpreter():
    """Larger n, head dims up to 128, m up to 128 (and 48, padded), every selection rule, fp16/bf16."""
    proc = run_cli(
        ["-m", "pytest", "tests/kernels/test_flashcur_kernels.py", "-q", "-s", "-m", "slow", "-p", "no:cacheprovider"],
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
        "task.max_length=32",
        "task.batch_size=4",
        "trainer.max_steps=3",
        "task.eval_every=3",
        "trainer.log_every_n_steps=1",
        "+trainer.limit_val_batches=1",
        "+trainer.limit_test_batches=1",
        "attention.num_landmarks=16",
    ]
    losses = {}
    for name, env in (("curformer", CPU_ONLY), ("flashcur", INTERPRETER_ENV)):
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
    with pytest.raises(ValueError, match="attention.impl=triton of FlashCURAttention cannot run on cpu tensors .*"
                                         "TRITON_INTERPRET=1 set before Python starts"):  # attention.impl's refusal
        attn(q, q, q, torch.ones(1, 20, dtype=torch.bool))


def test_values_of_another_width_are_refused_not_cut():
    """The kernels hold d columns of V: values of another width (a diagnostic's V = I, n wide) are refused with the
    PyTorch variant to use, by FlashCUR and by kernel (a)'s runner (which the fused CUR and Nyström rows stage also
    calls), before any launch, instead of returning d of their columns."""
    q = torch.randn(1, 2, 40, 32)
    wide = torch.eye(40).expand(1, 2, 40, 40)
    index = torch.arange(8).expand(1, 2, 8)
    with pytest.raises(ValueError, match=r"one shape \(B, H, n, d\), got \(1, 2, 40, 32\), \(1, 2, 40, 32\), "
                                         r"\(1, 2, 40, 40\); .*use attention=curformer"):
        attention.flashcur.flashcur_attention(q, q, wide, torch.ones(1, 40, dtype=torch.bool), index, index)
    with pytest.raises(ValueError, match="kernel \\(a\\) takes k, v"):
        kernel_run.rv_forward(q[:, :, :8], q, wide, torch.ones(1, 40, dtype=torch.bool))


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


# ---- the launch plan of a GPU step and its FLOPs, on meta tensors (no kernel runs) ----------------------------

GPU_PROGRAMS = 264  # two waves of an H100 / H200's 132 SMs


def planned_launches(batch, heads, n, d, m, dtype) -> list:
    """The FlashCUR kernels' launches of one layer's forward and backward, and the landmark means', as
    :func:`kernels.common.launch.recording` sees them on sm_90 (the launch functions' real Python on ``meta`` tensors)."""
    meta = dict(device="meta")
    q, k, v = (torch.empty(batch, heads, n, d, dtype=dtype, **meta) for _ in range(3))
    q_sel, k_sel = (torch.empty(batch, heads, m, d, dtype=dtype, **meta) for _ in range(2))
    key_mask = torch.empty(batch, n, dtype=torch.bool, **meta)
    valid = torch.empty(batch, heads, m, dtype=torch.bool, **meta)
    w = torch.empty(batch, heads, m, d, **meta)
    slot = torch.empty(batch, heads, n, dtype=torch.int32, **meta)
    with recording(90) as launches:
        rv, lse = kernel_run.rv_forward(q_sel, k, v, key_mask)
        kernel_run.u_forward(q_sel, k_sel, valid)
        y, lse_c = kernel_run.out_forward(q, k_sel, valid, w, rv, slot)
        kernel_run.rv_backward(q_sel, k, v, key_mask, rv, lse, rv)
        kernel_run.out_backward(q, k_sel, valid, w, slot, y, lse_c, y)
        landmark_launch.segment_means_forward(q.float(), k.float(), key_mask, m, -1e4)
    assert rv.shape == (batch, heads, m, d) and lse.shape == (batch, heads, m) and y.dtype == dtype
    return launches


@pytest.mark.parametrize("batch", [8, 32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_launch_plan_fills_an_h100_and_keeps_bf16_data_bf16(batch, dtype):
    """At H 2, n 4096, d 32, m 64: every kernel whose grid or loop grows with n (found by planning n / 2 too) has
    at least two waves of programs on 132 SMs, and in a bf16 step no n × d tensor a kernel reads or writes is
    float32 (per-token statistics, n floats per head, may be)."""
    heads, n, d, m = 2, 4096, 32, 64
    plan, half = (planned_launches(batch, heads, size, d, m, dtype) for size in (n, n // 2))
    assert [p.kernel for p in plan] == [p.kernel for p in half]
    for launch, smaller in zip(plan, half):
        print(f"{launch.kernel}: grid {launch.grid} ({launch.programs} programs), loop {launch.loop}")
        if launch.programs > smaller.programs or launch.loop[1] > smaller.loop[1]:  # grows with n (the split merge's
            assert launch.programs >= GPU_PROGRAMS, launch  # loop over the splits shrinks: S is bounded, not n-sized)
        if dtype == torch.bfloat16 and launch.kernel in kernel_launch.KERNELS:
            n_by_d = [t for shape, t in launch.tensors if shape == (batch, heads, n, d)]
            assert all(t == torch.bfloat16 for t in n_by_d) and bool(n_by_d) == (launch.kernel != "_u_fwd"), launch
    split = {p.kernel: p.grid[2] for p in plan if p.kernel in kernel_launch.SPLIT_KERNELS}
    assert set(split) == set(kernel_launch.SPLIT_KERNELS) and all(s > 1 for s in split.values()), split
    assert {p.kernel for p in plan} >= {"_rv_fwd", "_out_fwd", "_rv_bwd_kv", "_rv_bwd_q", "_out_bwd_q", "_out_bwd_kw",
                                        "_segment_means_fwd"}


@pytest.mark.parametrize(("programs", "n", "block_n"), [(16, 4096, 64), (64, 4096, 32), (4, 100, 32), (2, 16, 16),
                                                         (512, 4096, 64), (16, 300, 64)])
def test_splits_reach_two_waves_with_whole_tiles(programs, n, block_n):
    """The fewest splits that give ≥ 264 programs, none empty, each a whole number of tiles (the last may be
    short: n not a multiple of the split); one split once the other axes give enough programs."""
    parts, split_n = kernel_launch.splits(programs, n, block_n)
    tiles = -(-n // block_n)
    assert split_n % block_n == 0 and (parts - 1) * split_n < n <= parts * split_n
    assert programs * parts >= GPU_PROGRAMS or parts == tiles
    assert (parts == 1) == (programs >= GPU_PROGRAMS or tiles == 1)


def test_launch_configs_are_memoised():
    """A launch takes its configuration from a cache keyed by the shape (no re-derivation per call)."""
    args = ("_rv_fwd", 4096, 64, 32, torch.bfloat16, 90)
    assert kernel_launch.launch_config(*args) is kernel_launch.launch_config(*args)
    assert landmark_launch.launch_config("_segment_means_fwd", 64, 32, 3) is landmark_launch.launch_config(
        "_segment_means_fwd", 64, 32, 3)


def count_flops(cls, device, batch, heads, n, d, m) -> tuple[int, dict]:
    """FLOPs ``FlopCounterMode`` counts for one forward and backward of attention ``cls`` on ``device``."""
    with torch.device(device):
        attn = cls(heads, d, num_landmarks=m)
        q, k, v = (torch.randn(batch, heads, n, d, requires_grad=True) for _ in range(3))
        key_mask = torch.ones(batch, n, dtype=torch.bool)
    with FlopCounterMode(display=False) as counter:
        y = attn(q, k, v, key_mask)
        y.backward(torch.ones_like(y))
    return counter.get_total_flops(), {str(op): f for op, f in counter.get_flop_counts()["Global"].items()}


def test_flop_counter_sees_the_kernels():
    """``FlopCounterMode`` counts the kernels' matmul FLOPs (registered formulas of the lra_flashcur / lra_pinv ops)
    for a FlashCUR layer traced on ``meta`` (the CUDA path: fused pseudo-inverse), equal to the formula from the shapes:

        2·n·m·d per product × (2 + 2 forward + 7 + 7 backward kernel products; the backward recomputes the scores
        and dP: 6 more than autograd's 8) per sequence and head
        + 2·m²·d × 6 (U's scores, W = U⁺RV and its 2 gradients, dQ_I and dK_J of U)
        + 2·m³ × (4 + 11) × pinv_iters (the pseudo-inverse's forward and backward products per step).

    Against CURformer's fused PyTorch path on ``meta`` (batched GEMMs over materialised n × m weights: 4 + 8 products
    of 2·n·m·d) FlashCUR does more FLOPs for the same result, by its recomputation: a ratio in [1, 1.5] at this
    shape (1.16). On CPU the counter misses CUR's SDPA and C++ kernels (no formulas), so CPU counts understate CUR.
    """
    from attention.cur import CURAttention
    from attention.flashcur import FlashCURAttention

    batch, heads, n, d, m, iters = 2, 2, 1024, 32, 64, 6
    flash, by_op = count_flops(FlashCURAttention, "meta", batch, heads, n, d, m)
    bh = batch * heads
    expected = 2 * bh * n * m * d * (2 + 2 + 7 + 7) + 2 * bh * m * m * d * 6 + 2 * bh * m**3 * (4 + 11) * iters
    print(f"FlashCUR {flash / 1e9:.3f} GFLOP by op {by_op}")
    assert flash == expected
    assert by_op["lra_flashcur.rv_forward"] == ops.flops("rv_forward", bh, n, m, d) == 4 * bh * n * m * d
    cur, cur_by_op = count_flops(CURAttention, "meta", batch, heads, n, d, m)
    print(f"CUR (fused PyTorch path) {cur / 1e9:.3f} GFLOP by op {cur_by_op}; FlashCUR / CUR = {flash / cur:.2f}")
    assert 1 <= flash / cur <= 1.5


def test_a_planned_launch_gets_the_gpus_dots_even_under_the_interpreter(monkeypatch):
    """With ``TRITON_INTERPRET=1`` (how ``lra.bench plan --predict`` runs on a machine without a GPU) a launch on CPU
    tensors runs in the interpreter, in float32 dots; one on ``meta`` tensors is planned as a GPU runs it: bf16
    tensor-core dots. Planned with the interpreter's dots, FlashCUR's ``_rv_fwd`` compiled for sm_90 spilled and was
    predicted 0.94 ms slower at n 4096, B 8 (docs/bench.md)."""
    import kernels.common.launch as common_launch

    monkeypatch.setattr(common_launch, "interpreted", lambda: True)
    for device, float32_dots in (("cpu", True), ("meta", False)):
        like = torch.empty(1, device=device, dtype=torch.bfloat16)
        assert kernel_launch.config("_rv_fwd", 4096, 64, 32, like).constexprs["F32_DOT"] is float32_dots, device


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="kernels defined under the interpreter cannot be compiled for a GPU")
@pytest.mark.parametrize("capability", kernel_launch.CHECKED_CAPABILITIES)
def test_the_split_merge_compiles_without_spills(capability):
    """The merge of ``_rv_fwd``'s splits (one kernel, :mod:`kernels.cur.merge`) at FlashCUR's largest head dim."""
    from kernels.common.launch import SHARED_MEMORY_LIMIT
    from kernels.cur import merge

    compiled = merge.compile_kernel(capability, 128)
    assert compiled.stack == 0 and compiled.shared <= SHARED_MEMORY_LIMIT[capability], compiled
