"""``python -m lra.bench plan``: the launch plan of the CUDA path, computed on the CPU (meta device), and its rules.

The rules (:func:`lra.bench.plan.violations`) hold for the landmark variants at the attention benchmark's shape
(B 8, H 2, n 4096, d 32, m 64) and the Text training shape (B 32); the forms they replaced (one attention kernel
given the 64 landmark queries, in float32) break all three, so the rules can fail; grids follow the stated rules.
"""

from __future__ import annotations

import csv

import torch
import torch.nn.functional as F
from torch import nn

from lra.bench.__main__ import main
from lra.bench.plan import aten_kernel, compare, trace, violations


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
    main(["plan", "--variants", "curformer", "flashcur", "nystromformer", "--variant-overrides", "--out",
          str(tmp_path)])
    rows = read_csv(tmp_path / "plan.csv")
    for variant in ("curformer", "flashcur", "nystromformer"):
        for batch in ("8", "32"):
            planned = [r for r in rows if r["variant"] == variant and r["batch"] == batch]
            assert planned, f"{variant} at B {batch} was not planned"
            assert [r for r in planned if r["violation"]] == [], variant
            assert any(r["n_dependent"] == "True" for r in planned)  # the comparison with 2n ran
            assert all(r["n_sized_dtypes"] in ("", "bfloat16") for r in planned)
    softmax = [r for r in rows if r["variant"] == "softmax" and r["batch"] == "8"]
    attention = [r for r in softmax if "attention" in r["kernel"]]
    assert [int(r["programs"]) for r in attention] == [8 * 2 * 4096 // 64] * 2  # SDPA: 64 queries (keys) a program
