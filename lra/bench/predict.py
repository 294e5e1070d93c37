"""``python -m lra.bench plan --predict GPU``: the planned kernels of a layer with their predicted times
(:mod:`lra.bench.roofline`), the layer's eager and one-graph totals against SDPA's at the same shape, and the fourth
plan rule (:func:`lra.bench.roofline.slow_small_grid`). Rows of ``predict.csv``: one per kernel, then one ``total``
row per variant and batch."""

from __future__ import annotations

import argparse

from lra.bench import common, roofline

COLUMNS = ["gpu", "variant", "batch", "n", "heads", "head_dim", "landmarks", "dtype", "index", "phase", "kernel",
           "programs", "per_sm", "waves", "unit", "gflop", "mbytes", "us", "bound", "occupancy", "violation",
           "device_ms", "eager_ms", "graph_ms", "sdpa_eager_ms", "sdpa_graph_ms", "speedup_eager", "speedup_graph"]
_SDPA: dict = {}  # (gpu, batch, n, heads, d, dtype) -> SDPA's layer_times


def sdpa_times(args: argparse.Namespace, batch: int, gpu: roofline.Gpu, plan_variant) -> dict[str, float]:
    """SDPA's (``attention=softmax``) predicted layer times at the same shape, by the same model (memoised);
    ``plan_variant`` is :func:`lra.bench.plan.plan_variant`."""

    key = (gpu.name, batch, args.n, args.heads, args.head_dim, args.dtype)
    if key not in _SDPA:
        softmax = common.select_variants([common.BASELINE], [])[0]
        kernels = plan_variant(softmax, args, batch, capability=gpu.capability)
        shape = (batch, args.heads, args.n, args.landmarks, args.head_dim)
        _SDPA[key] = roofline.layer_times([roofline.predict(k, shape, gpu) for k in kernels])
    return _SDPA[key]


def report(variant: common.Variant, kernels: list, args: argparse.Namespace, batch: int, gpu: roofline.Gpu,
           plan_variant) -> list[dict]:
    """Prints the predicted table of ``kernels`` (``variant``'s planned layer at ``batch``) and its totals; returns the
    rows of ``predict.csv``."""
    shape = (batch, args.heads, args.n, args.landmarks, args.head_dim)
    predictions = [roofline.predict(kernel, shape, gpu) for kernel in kernels]
    times = roofline.layer_times(predictions)
    sdpa = sdpa_times(args, batch, gpu, plan_variant)
    head = {"gpu": gpu.name, "variant": variant.label, "batch": batch, "n": args.n, "heads": args.heads,
            "head_dim": args.head_dim, "landmarks": args.landmarks, "dtype": args.dtype}
    rows = []
    for index, (kernel, p) in enumerate(zip(kernels, predictions)):
        broken = roofline.slow_small_grid(kernel, p, gpu, sdpa["device"])
        rows.append({**head, "index": index, "phase": kernel.phase, "kernel": kernel.kernel, "programs": kernel.programs,
                     "per_sm": p.per_sm, "waves": p.waves, "unit": p.unit, "gflop": round(p.flops / 1e9, 4),
                     "mbytes": round(p.bytes / 1e6, 3), "us": round(p.seconds * 1e6, 1), "bound": p.bound,
                     "occupancy": p.occupancy, "violation": broken or ""})
    total = {**head, "index": "total", "device_ms": round(times["device"] * 1e3, 3),
             "eager_ms": round(times["eager"] * 1e3, 3), "graph_ms": round(times["graph"] * 1e3, 3),
             "sdpa_eager_ms": round(sdpa["eager"] * 1e3, 3), "sdpa_graph_ms": round(sdpa["graph"] * 1e3, 3),
             "speedup_eager": round(sdpa["eager"] / times["eager"], 3),
             "speedup_graph": round(sdpa["graph"] / times["graph"], 3)}
    broken = [row for row in rows if row["violation"]]
    print(f"\npredicted on {gpu.name} (lra/bench/roofline.py; a model, not a measurement):")
    print(common.format_table(rows, [
        ("index", "#", str), ("kernel", "kernel", str), ("programs", "programs", str), ("per_sm", "per SM", str),
        ("waves", "waves", str), ("unit", "unit", str), ("gflop", "GFLOP", str), ("mbytes", "MB", str),
        ("us", "µs", str), ("bound", "bound", str), ("occupancy", "occupancy", lambda v: v[:60]),
        ("violation", "rule 4", lambda v: v[:70]),
    ]))
    print(f"{variant.label}, B {batch}: {len(rows)} kernels, device {total['device_ms']} ms, eager {total['eager_ms']} ms, "
          f"one graph {total['graph_ms']} ms; SDPA eager {total['sdpa_eager_ms']} ms, graph {total['sdpa_graph_ms']} ms: "
          f"{total['speedup_eager']}x eager, {total['speedup_graph']}x as one graph; rule 4: "
          f"{'holds' if not broken else f'{len(broken)} kernels break it'}")
    return rows + [total]
