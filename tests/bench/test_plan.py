"""``python -m lra.bench plan``: the launch plan of the CUDA path, computed on the CPU (meta device), and its rules.

The rules (:func:`lra.bench.plan.violations`) hold for the landmark variants at the attention benchmark's shape
(B 8, H 2, d 32, m 64) and the Text training shape (B 32), at n 4096 and at lengths without a convenient divisor
(1999 and 4093, primes; 2000); the forms they replaced (one attention kernel given the 64 landmark queries, in
float32) break all three, so the rules can fail; grids follow the stated rules. The time model of ``--predict``
(:mod:`lra.bench.roofline`) on hand-made launches: roofline, wave quantisation, and the fourth rule.
"""

from __future__ import annotations

import argparse
import csv

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention import landmark_stages
from lra.bench import common, launches, roofline
from lra.bench.__main__ import main
from lra.bench.plan import Kernel, aten_kernel, compare, plan_variant, trace, violations


def read_csv(path) -> list[dict]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


class _OldRowsStage(nn.Module):
    """The R-stage as 380b043 ran it: q, k, v cast to float32, one attention call with the 64 selected queries."""

    def forward(self, q, k, v, key_mask):
        q, k, v = q.float(), k.float(), v.float()
        bias = torch.where(key_mask, 0.0, -1e30)[:, None, None, :]
        return F.scaled_dot_product_attention(q[:, :, :64], k, v, attn_mask=bias)


def _planned(module, n: int, batch: int = 8, heads: int = 2, d: int = 32):
    def args(length):
        tensors = [torch.empty(batch, heads, length, d, device="meta") for _ in range(3)]
        return (*tensors, torch.ones(batch, length, dtype=torch.bool, device="meta"))

    runs = [trace(module, args(length), {}, torch.bfloat16) for length in (n, 2 * n)]
    return compare(*runs, per_token=batch * heads * n)


def test_the_rules_catch_a_skinny_float32_attention_call():
    kernels = _planned(_OldRowsStage(), 4096)
    broken = {k.kernel: " ".join(violations(k, torch.bfloat16)) for k in kernels if violations(k, torch.bfloat16)}
    forward = broken["_scaled_dot_product_efficient_attention"]
    assert "n-dependent on 16 programs" in forward  # B·H programs, each walking the 4096 keys
    assert "64 queries" in forward
    assert any("float32 n-sized tensor" in reasons for reasons in broken.values())  # the float32 copies of k, v


class _SplitKRows(nn.Module):
    """The fused forms' split-K rows stage, which runs where kernel (a) cannot take the rows (Nyström-256)."""

    def forward(self, q, k, v, key_mask):
        return landmark_stages.rows_attention(q[:, :, :256].contiguous(), k, v, key_mask, "fused")


@pytest.mark.parametrize("n", [1999, 4096])
def test_the_split_k_rows_stage_keeps_the_rules(n):
    kernels = _planned(_SplitKRows(), n)
    assert [(k.kernel, violations(k, torch.bfloat16)) for k in kernels if violations(k, torch.bfloat16)] == []
    assert any(k.kernel == "amax" for k in kernels) and not any("lra_flashcur" in k.kernel for k in kernels)


def test_grid_rules_by_hand():
    a, b = torch.empty(16, 4096, 32, device="meta"), torch.empty(16, 32, 64, device="meta")
    gemm = aten_kernel(torch.ops.aten.bmm.default, (a, b), {}, torch.empty(16, 4096, 64, device="meta"), "forward")
    assert (gemm.programs, gemm.loop, gemm.trips) == (16 * 32 * 1, "K", 1)  # 128 × 128 tiles, K = 32 in one step
    scores = torch.empty(16, 4096, 64, device="meta")
    column_max = aten_kernel(torch.ops.aten.amax.default, (scores, [-2], True), {},
                             torch.empty(16, 1, 64, device="meta"), "forward")
    # 1,024 outputs: 32 blocks; 4,096 values each over 16 warps = 256 a thread, so split across blocks: at most
    # ceil(528 / 32) = 17 (4 blocks an SM), at least 16 values a thread: min(17, 256 / 16) = 16 blocks an output
    assert column_max.programs == 32 * 16 and column_max.trips == 256 // 16
    rows = torch.empty(16 * 4096, 64, device="meta")
    softmax = aten_kernel(torch.ops.aten._softmax.default, (rows, -1, False), {}, rows, "forward")
    assert softmax.programs == 16 * 4096 // 4  # one warp a row of 64, four rows a block


def test_plan_command_rules_hold_for_the_landmark_variants(tmp_path):
    main(["plan", "--variants", "curformer", "flashcur", "nystromformer", "--variant-overrides", "--batches", "8",
          "--out", str(tmp_path)])  # B 32 and other lengths: test_rules_hold_at_any_length
    rows = read_csv(tmp_path / "plan.csv")
    for variant in ("curformer", "flashcur", "nystromformer"):
        for batch in ("8",):
            planned = [r for r in rows if r["variant"] == variant and r["batch"] == batch]
            assert planned, f"{variant} at B {batch} was not planned"
            assert [r for r in planned if r["violation"]] == [], variant
            assert any(r["n_dependent"] == "True" for r in planned)  # the comparison with 2n ran
            assert all(r["n_sized_dtypes"] in ("", "bfloat16") for r in planned)
    for variant in ("curformer", "nystromformer"):  # their rows stage by FlashCUR's kernel (a): Forms.rows
        names = {r["kernel"] for r in rows if r["variant"] == variant}
        assert {"lra_flashcur::rv_forward:_rv_fwd", "lra_flashcur::rv_backward:_rv_bwd_q"} <= names, variant
        assert "amax" not in names  # the split-K stage's masked maximum
    softmax = [r for r in rows if r["variant"] == "softmax" and r["batch"] == "8"]
    attention = [r for r in softmax if "attention" in r["kernel"]]
    assert [int(r["programs"]) for r in attention] == [8 * 2 * 4096 // 64] * 2  # SDPA: 64 queries (keys) a program


@pytest.mark.parametrize("variant", ["curformer", "flashcur", "nystromformer"])
def test_rules_hold_at_any_length(variant):
    """Primes and 2000 (ListOps' length) plan as 4096 does: no chunk of one token, no short grid, no float32 n-sized
    tensor. One config per variant (composed at 2 · 4096, the longest run), traced at each n and 2n on meta."""
    shape = dict(heads=2, head_dim=32, landmarks=64, dtype="bf16", variants=None, variant_overrides=[])
    chosen = common.select_variants([variant], [])[-1]
    cfg = launches.variant_config(chosen, argparse.Namespace(n=2 * 4096, **shape))
    for n in (1999, 2000, 4093, 4096):
        for batch in (8, 32):
            kernels = plan_variant(chosen, argparse.Namespace(n=n, **shape), batch, cfg)
            broken = [(k.kernel, violations(k, torch.bfloat16)) for k in kernels if violations(k, torch.bfloat16)]
            assert broken == [], (variant, n, batch)
            assert any(k.n_dependent for k in kernels)  # the comparison with 2n ran
            splits = [k for k in kernels if k.kernel == "bmm" and k.n_dependent]
            assert all(k.programs >= 264 for k in splits)


def _gemm(programs: int, flops: float, dtype=torch.bfloat16) -> Kernel:
    """A bmm launch of ``programs`` tiles doing ``flops`` (work = flops / 2) on 1 MB of ``dtype`` operands."""
    numel = 2 ** 20 // dtype.itemsize
    return Kernel("bmm", "forward", programs, "K", 1, int(flops // 2), ((numel, dtype), (numel, dtype)))


def test_roofline_compute_memory_and_waves():
    gpu = roofline.GPUS["h200"]
    shape = (8, 2, 4096, 64, 32)
    big = roofline.predict(_gemm(2 * gpu.sms, 1e12), shape, gpu)  # 2 waves of one tile an SM, compute-bound
    expected = roofline.FLOOR + 1e12 / (gpu.bf16 * roofline.EFFICIENCY * min(1.0, 8 / roofline.LATENCY_WARPS))
    assert big.unit == "tensor" and big.bound == "compute" and big.waves == 2
    assert big.seconds == pytest.approx(expected)
    one_more = roofline.predict(_gemm(2 * gpu.sms + 1, 1e12), shape, gpu)  # a third, almost empty wave
    assert one_more.waves == 3 and one_more.seconds > big.seconds
    fp32 = roofline.predict(_gemm(2 * gpu.sms, 1e12, torch.float32), shape, gpu)
    assert fp32.unit == "fp32" and fp32.seconds > 10 * big.seconds  # FMA units: 1/15 of the tensor cores' peak
    copy = roofline.predict(_gemm(2 * gpu.sms, 0.0), shape, gpu)
    assert copy.bound == "memory"
    assert copy.seconds == pytest.approx(roofline.FLOOR + 2 ** 21 / (gpu.hbm * roofline.MEMORY_EFFICIENCY))
    a100 = roofline.predict(_gemm(2 * gpu.sms, 1e12), shape, roofline.GPUS["a100"])
    assert a100.waves == 3 and a100.seconds > 3 * big.seconds  # 108 SMs, 312 TFLOP/s


def test_fourth_rule_flags_a_slow_kernel_on_few_programs():
    gpu = roofline.GPUS["h200"]
    shape = (8, 2, 4096, 64, 32)
    sdpa = 1e-3
    slow = _gemm(16, 2e10)  # 16 programs (< 132 SMs), each on one SM with 8 warps
    slow_time = roofline.predict(slow, shape, gpu)
    assert slow_time.seconds > 0.05 * sdpa and "16 programs" in roofline.slow_small_grid(slow, slow_time, gpu, sdpa)
    small = _gemm(16, 1e6)
    assert roofline.slow_small_grid(small, roofline.predict(small, shape, gpu), gpu, sdpa) is None
    wide = _gemm(4 * gpu.sms, 1e12)  # slow, but on the whole GPU
    assert roofline.slow_small_grid(wide, roofline.predict(wide, shape, gpu), gpu, sdpa) is None
    times = roofline.layer_times([slow_time] * 10)
    assert times["graph"] == pytest.approx(roofline.GRAPH_LAUNCH + 10 * slow_time.seconds)
    assert times["eager"] == max(times["device"], roofline.HOST_PER_CALL + 10 * roofline.HOST_PER_LAUNCH)


def test_the_pseudo_inverse_is_priced_in_its_kernels_dot_precision():
    """The planned CUR layer's pseudo-inverse: every product on the tensor cores in 3xTF32 (a third of the TF32 peak),
    read from the kernels' module; BLOCK³ products per step, four forward and eleven backward (three recomputing the
    step's terms on one program per problem and step, seven in the serial kernel, one summing ∂A)."""
    shape = dict(heads=2, head_dim=32, landmarks=64, dtype="bf16", variants=None, variant_overrides=[])
    chosen = common.select_variants(["curformer"], [])[-1]
    kernels = plan_variant(chosen, argparse.Namespace(n=1024, **shape), 8)
    pinv = {k.kernel.split(":")[-1]: k for k in kernels if "_pinv_" in k.kernel}
    assert set(pinv) == {"_pinv_fwd", "_pinv_bwd_terms", "_pinv_bwd_steps", "_pinv_bwd_grad"}
    assert pinv["_pinv_bwd_terms"].programs == 16 * pinv["_pinv_fwd"].trips  # B·H problems × n_iter steps
    priced = {name: roofline.triton_flops(kernel, (8, 2, 1024, 64, 32)) for name, kernel in pinv.items()}
    assert {unit for _, unit in priced.values()} == {"tf32x3"}
    forward_flops = priced["_pinv_fwd"][0]
    assert forward_flops == 2 * 64**3 * 4 * pinv["_pinv_fwd"].trips * 16  # 16 problems (B·H), n_iter trips
    assert priced["_pinv_bwd_terms"][0] == forward_flops * 3 / 4
    assert priced["_pinv_bwd_steps"][0] == forward_flops * 7 / 4 and priced["_pinv_bwd_grad"][0] == forward_flops / 4
    forward_unit = priced["_pinv_fwd"][1]
    gpu = roofline.GPUS["h200"]
    assert roofline.UNIT_PEAK[forward_unit](gpu) == gpu.tf32 / 3


def test_profile_predict_joins_the_plans_kernels_by_their_cuda_names():
    """``lra.bench profile --predict``'s join (lra/bench/calibrate.py) on the planned CURformer layer: a measured
    kernel named as the Triton function meets its prediction; the cuBLAS and elementwise kernels, named otherwise,
    fall in ``other``; ``phase`` holds every kernel, measured and predicted."""
    from lra.bench import calibrate

    args = argparse.Namespace(n=1024, heads=2, head_dim=32, landmarks=64, dtype="bf16", variants=None,
                              variant_overrides=[])
    gpu = roofline.GPUS["h200"]
    predicted = calibrate.predicted(common.Variant("curformer"), args, 8, gpu, aot=False)
    backward = predicted["backward"]
    assert {"_pinv_bwd_terms", "_pinv_bwd_steps", "_pinv_bwd_grad"} <= set(backward)
    assert "_pinv_fwd" in predicted["forward"]
    measured = [{"op": "_pinv_bwd_steps", "ms": 0.1}, {"op": "sm90_xmma_gemm_bf16bf16_bf16f32", "ms": 0.02},
                {"op": "_pinv_bwd_grad", "ms": 0.01}]
    rows = {row["kernel"]: row for row in calibrate.compare(measured, backward)}
    steps = rows["_pinv_bwd_steps"]
    assert steps["predicted_ms"] == pytest.approx(backward["_pinv_bwd_steps"] * 1e3)
    assert steps["ratio"] == pytest.approx(0.1 / steps["predicted_ms"])
    joined = backward["_pinv_bwd_steps"] + backward["_pinv_bwd_grad"]
    assert rows["other"]["measured_ms"] == pytest.approx(0.02)
    assert rows["other"]["predicted_ms"] == pytest.approx((sum(backward.values()) - joined) * 1e3)
    assert rows["phase"]["measured_ms"] == pytest.approx(0.13)
    assert rows["phase"]["predicted_ms"] == pytest.approx(sum(backward.values()) * 1e3)
