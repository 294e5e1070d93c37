"""Predicted against measured, kernel by kernel: ``python -m lra.bench profile --predict GPU`` on CUDA.

The time model of ``lra.bench plan --predict`` (:mod:`lra.bench.roofline`) is fitted on few GPU measurements, so
every GPU run should say how far it is off. After each profiled phase (forward, backward) the profile has the
GPU time of every kernel (:func:`lra.bench.profile.kernel_rows`); :func:`predicted` plans the same variant at the
same shape (:func:`lra.bench.plan.plan_variant`, on ``meta``) and prices each planned kernel, and :func:`compare`
joins the two by kernel name: our Triton kernels carry their ``@triton.jit`` function's name in both (the plan's
``lra_pinv::forward:_pinv_fwd`` is the profile's ``_pinv_fwd``), ATen's kernels (cuBLAS, the elementwise ones) do
not, so those are compared as one remainder, with the phase's totals.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from lra.bench import common, roofline


def predicted(variant: common.Variant, args: argparse.Namespace, batch: int, gpu: roofline.Gpu,
              aot: bool = True) -> dict[str, dict[str, float]]:
    """``{phase: {kernel name: predicted seconds}}`` of ``variant``'s layer at ``batch`` × ``args.n`` (``args``:
    ``n``, ``heads``, ``head_dim``, ``landmarks``, ``dtype``), launches of one name summed. ``aot``: occupancy from
    AOT compiles (as ``plan --predict``), else one program a SM."""
    from lra.bench.plan import plan_variant

    shape = (batch, args.heads, args.n, args.landmarks, args.head_dim)
    times: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for kernel in plan_variant(variant, args, batch, capability=gpu.capability):
        times[kernel.phase][roofline.kernel_name(kernel.kernel)] += roofline.predict(kernel, shape, gpu, aot=aot).seconds
    return times


def compare(measured: list[dict], predictions: dict[str, float]) -> list[dict]:
    """Rows ``kernel, measured_ms, predicted_ms, ratio`` (measured / predicted) for the kernels in both, then
    ``other`` (every measured kernel without a prediction of its name against every prediction without a measured
    kernel) and ``phase`` (all of them). ``measured``: :func:`lra.bench.profile.kernel_rows` (``op``, ``ms`` per
    call); ``predictions``: one phase of :func:`predicted`."""
    by_name = {row["op"]: row["ms"] for row in measured}
    rows = [{"kernel": name, "measured_ms": by_name[name], "predicted_ms": seconds * 1e3}
            for name, seconds in predictions.items() if name in by_name]
    joined = {row["kernel"] for row in rows}
    rows.append({"kernel": "other", "measured_ms": sum(ms for name, ms in by_name.items() if name not in joined),
                 "predicted_ms": sum(s for name, s in predictions.items() if name not in joined) * 1e3})
    rows.append({"kernel": "phase", "measured_ms": sum(by_name.values()),
                 "predicted_ms": sum(predictions.values()) * 1e3})
    for row in rows:
        row["ratio"] = row["measured_ms"] / row["predicted_ms"] if row["predicted_ms"] else None
    return rows


def print_comparison(rows: list[dict], gpu: roofline.Gpu) -> None:
    print(f"predicted on {gpu.name} (lra.bench plan --predict) against measured, by kernel name:")
    print(common.format_table(rows, [
        ("kernel", "kernel", str), ("measured_ms", "measured ms", lambda v: f"{v:.3f}"),
        ("predicted_ms", "predicted ms", lambda v: f"{v:.3f}"), ("ratio", "measured / predicted", common.times),
    ]))
