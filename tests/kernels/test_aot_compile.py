"""Every FlashCUR kernel compiles ahead of time for sm_80 (A100) and sm_90 (H100) within the GPU's limits.

No GPU needed: :func:`kernels.cur.launch.compile_kernel` runs Triton's compiler and the ``ptxas`` of its wheel
for the target, with the launch parameters of :func:`kernels.cur.launch.launch_config` — the function
the wrappers launch with — and asserts per kernel, architecture, dtype and supported shape:

* it compiles;
* shared memory per block ≤ the architecture's opt-in maximum (sm_80 167,936 B, sm_90 232,448 B),
  else the launch fails with ``OutOfResources``;
* no register spills: a stack frame of 0 bytes in the cubin (spilled registers go to slow local
  memory); :data:`kernels.cur.tiles.REGISTER_TILES` is the measured table that makes this hold;
* :func:`kernels.cur.launch.shared_memory_estimate` (what the rule decides with) does not under-count
  the compiler's figure by more than 1 KiB, so the rule stays safe when a kernel changes.

The default suite compiles the largest shape (m = d = 128, long n) in fp32 (IEEE dots, on the FMA
units) for sm_80 — the case that spilled in every kernel before the register rule — for every kernel
(:data:`FAST`), with bf16 ``_rv_bwd_kv`` and the split bf16 ``_rv_fwd`` at m = 64, d = 128 on sm_90 (~15 s with an
empty Triton cache on an idle core).
``-m slow`` compiles every distinct launch of every kernel × {sm_80, sm_90} × {fp32 (IEEE and TF32
dots), bf16, fp16} × m ∈ {16, 32, 64, 128} × d ∈ {16, 32, 64, 128} × n ∈ {16, 32, 4096}
(``BLOCK_D`` is ``next_pow2(d)``, so these d stand for all of 16..128; ``BLOCK_N`` only shrinks below
n = 64): 1,184 compiles, ~8 min on one core. Set ``TRITON_CACHE_DIR`` to keep the compiled kernels
between runs.
"""

from __future__ import annotations

import functools
import itertools
import os

import pytest
import torch

from kernels.common.launch import SHARED_MEMORY_LIMIT
from kernels.cur import launch, tiles

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="kernels defined under the interpreter cannot be compiled for a GPU"
)

DTYPES = {"fp32": (torch.float32, False), "fp32-tf32": (torch.float32, True), "bf16": (torch.bfloat16, False),
          "fp16": (torch.float16, False)}
HEAD_DIMS = (16, 32, 64, 128)
TOKENS = (16, 32, 4096)
# Every kernel at the largest shape in fp32 on sm_80, bf16 _rv_bwd_kv (47,248 B of spills before), and the split
# bf16 _rv_fwd with a 64 × 128 accumulator on sm_90 (96 B of spills with 4 warps: SHARED_RULE_WIDE).
FAST = [(kernel, 80, "fp32", 4096, 128, 128) for kernel in launch.KERNELS] + [("_rv_bwd_kv", 80, "bf16", 4096, 128, 128),
                                                                              ("_rv_fwd", 90, "bf16", 4096, 64, 128)]


def config_of(case) -> launch.LaunchConfig:
    kernel, capability, dtype_name, n, m, d = case
    dtype, tf32 = DTYPES[dtype_name]
    return launch.launch_config(kernel, n, m, d, dtype, capability, tf32=tf32)


def distinct_launches(cases) -> list:
    """The first case of each distinct (kernel, architecture, dtype, launch config): the same launch compiles the same."""
    seen, kept = set(), []
    for case in cases:
        config = config_of(case)
        key = (*case[:3], tuple(sorted(config.constexprs.items())), config.num_warps, config.num_stages)
        if key not in seen:
            seen.add(key)
            kept.append(case)
    return kept


SLOW = distinct_launches(
    [*FAST, *itertools.product(launch.KERNELS, launch.CHECKED_CAPABILITIES, DTYPES, TOKENS, launch.SUPPORTED_M, HEAD_DIMS)]
)[len(FAST):]


def case_id(case) -> str:
    kernel, capability, dtype, n, m, d = case
    return f"{kernel}-sm{capability}-{dtype}-n{n}-m{m}-d{d}"


@functools.lru_cache(maxsize=None)
def compile_case(case):
    """The case compiled once per test session (compiling is the expensive part)."""
    kernel, capability, dtype_name, n, m, d = case
    dtype, tf32 = DTYPES[dtype_name]
    return launch.compile_kernel(kernel, capability, dtype, n, m, d, tf32=tf32)


def estimate_of(case, config: launch.LaunchConfig) -> int:
    """:func:`kernels.cur.launch.shared_memory_estimate` of ``case`` launched with ``config``."""
    kernel, _, _, n, m, d = case
    sizes = {**launch.block_sizes(n, m, d), **config.constexprs, "M": m}
    return launch.shared_memory_estimate(kernel, sizes, config.num_stages, 4 if sizes["F32_DOT"] else 2,
                                         tf32=sizes["PRECISION"] == "tf32")


def check_compiled(case) -> None:
    """Compiles, fits the architecture's shared memory, spills no registers, and the rule's estimate
    does not under-count the shared memory."""
    kernel, capability, _, n, m, d = case
    compiled = compile_case(case)
    where = f"{case_id(case)} {compiled.config.options}"
    print(f"{where}: shared {compiled.shared:,} B, {compiled.registers} registers, stack {compiled.stack} B")
    assert compiled.shared <= compiled.limit, f"{where}: {compiled.shared:,} B shared memory > sm_{capability} limit {compiled.limit:,}"
    assert compiled.stack == 0, (f"{where}: registers spill ({compiled.stack} B stack frame, {compiled.registers} registers): "
                                 "shrink this kernel's entry in kernels.cur.tiles.REGISTER_TILES")
    estimate = estimate_of(case, compiled.config)
    assert compiled.shared <= estimate + 1024, f"{where}: estimate {estimate:,} B under-counts compiled {compiled.shared:,} B"


@pytest.mark.parametrize("case", FAST, ids=case_id)
def test_largest_fp32_shape_fits_an_a100_without_spills(case):
    check_compiled(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW, ids=case_id)
def test_every_kernel_arch_dtype_and_shape(case):
    check_compiled(case)


@pytest.mark.parametrize("kernel", launch.KERNELS)
@pytest.mark.parametrize("capability", launch.CHECKED_CAPABILITIES)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_rule_keeps_the_estimate_under_the_limit(kernel, capability, dtype_name):
    """Cheap (no compile): for every supported (m, d) the chosen tiles' estimate fits with the margin,
    the tiles are dot-safe powers of two within the register table's bounds."""
    dtype, tf32 = DTYPES[dtype_name]
    for m, d, n in itertools.product(launch.SUPPORTED_M, HEAD_DIMS, (1, 16, 100, 4096)):
        config = launch.launch_config(kernel, n, m, d, dtype, capability, tf32=tf32)
        assert estimate_of((kernel, capability, dtype_name, n, m, d), config) <= SHARED_MEMORY_LIMIT[capability] - launch.MARGIN
        for name in ("BLOCK_N", "BLOCK_M", "BLOCK_D"):
            if name in config.constexprs:
                size = config.constexprs[name]
                assert size >= launch.MIN_DOT and size & (size - 1) == 0, (name, size)
        assert m % config.constexprs["BLOCK_M"] == 0
        block_n = config.constexprs.get("BLOCK_N", launch.MIN_DOT)
        rule = tiles.register_launch(kernel, tiles.operands(dtype, tf32), m, config.constexprs["BLOCK_D"], block_n)
        if rule is not None:  # sm_80 / sm_90 never cut a register rule's tiles for shared memory
            assert (config.constexprs["BLOCK_M"], config.num_warps, config.num_stages) == rule, (m, d, n, config)


def test_every_kernel_with_an_ieee_float32_dot_has_a_register_rule():
    """A kernel that multiplies by a float32 tensor (W, RV, gradients: a float32 tile in
    :data:`kernels.cur.tiles.TILES`) has IEEE fp32 dots on the FMA units for every input dtype, so it
    needs a measured entry for every operand class; the others need one for fp32 inputs only."""
    for kernel in launch.KERNELS:
        has_f32_tensor = any(f32 for group in tiles.TILES[kernel].values() for *_, f32 in group)
        classes = ("fp32", "tf32", "half") if has_f32_tensor else ("fp32",)
        assert all(tiles.REGISTER_TILES[kernel][name] is not None for name in classes), kernel


def test_tiles_before_the_rules_overflow_an_a100():
    """The tiles before the per-architecture rule (BLOCK_N = BLOCK_M = 64, 3 stages) exceed sm_80 at fp32,
    m = d = 128: the estimate reproduces the compiled figures of the two kernels whose structure is
    unchanged since (compiled then: _rv_bwd_q 212,992 B, _rv_fwd 180,480 B)."""
    sizes = {"BLOCK_N": 64, "BLOCK_M": 64, "BLOCK_D": 128, "M": 128}
    for kernel, compiled in (("_rv_bwd_q", 212_992), ("_rv_fwd", 180_480)):
        estimate = launch.shared_memory_estimate(kernel, sizes, 3, 4)
        assert abs(estimate - compiled) <= 256 and estimate > SHARED_MEMORY_LIMIT[80], (kernel, estimate)


def test_a_shape_no_tile_serves_is_a_config_error():
    """Chunking the m slots lets sm_86 (RTX 30xx, 99 KiB per block) serve m = d = 128; what no tiling
    serves — _u_fwd's m × d block of keys in fp32 on sm_75 (64 KiB) — is refused naming the keys."""
    launch.check_shape(128, 128, 86)
    with pytest.raises(ValueError, match=r"attention\.num_landmarks.*head_dim 128 in fp32 on sm_75"):
        launch.launch_config("_u_fwd", 4096, 128, 128, torch.float32, 75)


# ---- python -m lra.bench.gpu_check: the parts that run without a GPU ------------------------------------


def test_gpu_check_plan_covers_every_variant_and_step(tmp_path):
    from lra.bench import gpu_check

    args = gpu_check.parse_args(["--out", str(tmp_path), "--n", "1024", "16384", "--steps", "300"])
    steps = gpu_check.plan(args)
    assert [s.name for s in steps].count("bench-attention") == 2 and steps[0].name == "kernels"
    trained = {arg.split("=", 1)[1] for s in steps if s.name == "train" for arg in s.command if arg.startswith("attention=")}
    assert trained == set(args.variants) and {"softmax", "curformer", "flashcur"} <= trained
    train = next(s for s in steps if s.name == "train")
    assert "trainer=gpu" in train.command and "trainer.max_steps=300" in train.command
    bench = next(s for s in steps if s.name == "bench-train")
    assert bench.command[bench.command.index("--n") + 1:][:2] == ["1024", "16384"]
    assert [s.name for s in gpu_check.plan(gpu_check.parse_args(["--only", "kernels"]))] == ["kernels"]


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--n", "8"], ["--only", "nope"]])
def test_gpu_check_rejects_bad_arguments(argv, capsys):
    """A usage error (exit 2) that names the option."""
    from lra.bench import gpu_check

    with pytest.raises(SystemExit) as exit_info:
        gpu_check.parse_args(argv)
    assert exit_info.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_gpu_check_report_lists_each_step(tmp_path):
    from lra.bench import gpu_check

    steps = [gpu_check.Step("kernels", "FlashCUR vs CUR", None, "ok", 3.2, ["| a |"]),
             gpu_check.Step("train", "300 steps of softmax", ["python", "-m", "lra.train"], "failed (exit 1)", 9.0, ["boom"])]
    gpu_check.write_report(tmp_path / "r" / "report.md", steps, {"GPU": "test"})
    text = (tmp_path / "r" / "report.md").read_text()
    assert "| kernels | FlashCUR vs CUR | ok | 3 |" in text and "| train | 300 steps of softmax | failed (exit 1) | 9 |" in text
    assert "## train: 300 steps of softmax" in text and "boom" in text and "- GPU: test" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_gpu_check_without_cuda_fails_in_one_line(tmp_path):
    from tests.conftest import run_cli

    proc = run_cli(["-m", "lra.bench.gpu_check", "--out", str(tmp_path)])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "lra.bench.gpu_check needs a CUDA GPU (torch.cuda.is_available() is False); use --dry-run to see the plan"
    ]
    dry = run_cli(["-m", "lra.bench.gpu_check", "--dry-run", "--only", "train", "--variants", "softmax"])
    assert dry.returncode == 0 and "attention=softmax" in dry.stdout and "trainer=gpu" in dry.stdout
