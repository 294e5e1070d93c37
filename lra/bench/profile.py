"""``python -m lra.bench profile --variant V [V ...] --n N``: where each variant's time goes, operator by operator
(CPU) or kernel by kernel (CUDA).

Builds the row that ``python -m lra.bench attention`` measures for ``V`` (:func:`lra.bench.cases.build_cases`:
the attention core for a drop-in variant, on ``q, k, v`` of ``--dtype``; the one-layer model otherwise; eval mode,
no dropout) and runs it under ``torch.profiler`` in two phases profiled apart:

* **forward** — ``--repeats`` forwards under ``torch.no_grad`` (what ``fwd_s`` times);
* **backward** — ``--repeats`` backwards of ``out.sum()`` (+ auxiliary losses), each after an unprofiled
  forward with autograd on (the part ``fwdbwd_s`` adds to a forward).

Per phase it prints the wall time per call, the FLOPs of one call (``FlopCounterMode``, as the attention
benchmark counts them, custom ops with a registered formula included) and the FLOP/s they reach, then the
``--top`` entries by time:

* on CPU (CPU activity; one thread unless ``--threads``): ATen operators by self time: ms per call, share of the
  phase's profiled self time, calls per call of the phase;
* on CUDA (CPU and CUDA activity; :func:`kernel_rows`): GPU kernels (and memory copies and sets) by their time on the
  GPU: CUDA ms per call of the phase, share, launches per call, and each kernel's launch shape from the profiler's
  trace (the chrome trace's kernel events carry ``grid`` and ``block``): ``programs`` (grid blocks, their range
  where launches differ) and threads per program. A kernel with fewer programs than the GPU has SMs (132 on an
  H100/H200) leaves most of it idle; the phase line adds ``GPU busy``: the kernels' time over the wall time (low:
  launch-bound).

Several ``--variant`` names are profiled one after the other (one that cannot run here, e.g. FlashCUR without
CUDA, is reported and skipped); ``--softmax`` adds the SDPA row first, to compare against. Nothing is written to
disk. ``--predict h100|h200|a100`` (CUDA): after each phase, that GPU's predicted times of the same layer
(``lra.bench plan --predict``) beside the measured ones, kernel by kernel where the names match (our Triton
kernels), the rest and the phase as totals (:mod:`lra.bench.calibrate`): how far the time model is off.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from lra.bench import calibrate, common, counters, roofline
from lra.bench.attention import objective
from lra.bench.cases import Case, build_cases


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", required=True, nargs="+",
                        help="configs/attention/*.yaml names, e.g. curformer (several: profiled one after another)")
    parser.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help="the variants' own config keys, e.g. num_landmarks=128 (given to each --variant)")
    parser.add_argument("--n", type=int, default=4096, help="sequence length")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--level", choices=["auto", "layer"], default="auto", help="as for the attention benchmark")
    parser.add_argument("--warmup", type=int, default=1, help="unprofiled calls before each phase")
    parser.add_argument("--repeats", type=int, default=3, help="profiled calls per phase")
    parser.add_argument("--top", type=int, default=15, help="operators (CPU) or kernels (CUDA) listed per phase")
    parser.add_argument("--softmax", action="store_true", help="profile the SDPA row too")
    parser.add_argument("--predict", choices=sorted(roofline.GPUS),
                        help="on CUDA: after each phase, this GPU's predicted time (lra.bench plan --predict) against "
                             "the measured one, kernel by kernel (lra/bench/calibrate.py)")
    parser.add_argument("--landmarks", type=int, default=64,
                        help="attention.num_landmarks the prediction plans with (the variants' default 64)")


DEVICE_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")  # the chrome trace's categories of GPU activity


def profile_phase(step, prepare, calls: int, warmup: int,
                  device: torch.device = torch.device("cpu")) -> tuple[float, list[dict], float | None]:
    """Median wall seconds of ``step()`` over ``calls`` profiled calls, its rows by time and, on CUDA, the share of
    the wall time the GPU spent in kernels (None on CPU); ``prepare()`` runs before each call, outside the profiler
    and the timer.

    Rows on CPU: ATen operators by self CPU time (ms and calls per call of ``step``, share of its profiled self
    time). On CUDA: :func:`kernel_rows` of the profiler's trace (CUDA time per call, launches, grid)."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    for _ in range(warmup):
        prepare()
        step()
    seconds, totals, trace = [], {}, []
    for _ in range(calls):
        prepare()
        common.synchronize(device)
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            step()
            common.synchronize(device)  # every kernel of the call ends inside the profiled region
            seconds.append(time.perf_counter() - start)
        if cuda:
            trace += device_events(prof)
            continue
        for event in prof.key_averages():
            us, count = totals.get(event.key, (0.0, 0))
            totals[event.key] = (us + event.self_cpu_time_total, count + event.count)
    wall = sorted(seconds)[len(seconds) // 2]
    if cuda:
        rows = kernel_rows(trace, calls)
        busy = sum(row["ms"] for row in rows) / 1e3 / (sum(seconds) / calls)
        return wall, rows, busy
    whole = sum(us for us, _ in totals.values()) or 1.0
    rows = [{"op": key, "ms": us / 1e3 / calls, "share": us / whole, "calls": count / calls}
            for key, (us, count) in totals.items() if us > 0]
    rows.sort(key=lambda row: row["ms"], reverse=True)
    return wall, rows, None


def device_events(prof) -> list[dict]:
    """The GPU events (:data:`DEVICE_EVENTS`) of a finished profile, as its chrome trace writes them: ``name``,
    ``dur`` (µs), ``cat`` and, for kernels, ``args`` with ``grid`` and ``block`` (x, y, z)."""
    with tempfile.TemporaryDirectory(prefix="lra-profile-") as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return [event for event in events if event.get("ph") == "X" and event.get("cat") in DEVICE_EVENTS]


def kernel_rows(events: list[dict], calls: int) -> list[dict]:
    """One row per kernel name over the trace ``events`` of ``calls`` profiled calls, by time: ``op`` (the kernel),
    ``ms`` (GPU time per call), ``share`` (of all the events' time), ``calls`` (launches per call), ``programs``
    (``grid`` x·y·z: blocks, or "least–most" where launches differ) and ``threads`` (``block`` x·y·z per program);
    memory copies and sets have no grid ("-")."""
    totals: dict[str, dict] = {}
    for event in events:
        row = totals.setdefault(event["name"], {"us": 0.0, "count": 0, "programs": set(), "threads": set()})
        row["us"] += float(event.get("dur", 0.0))
        row["count"] += 1
        args = event.get("args", {})
        if "grid" in args:
            row["programs"].add(math.prod(args["grid"]))
        if "block" in args:
            row["threads"].add(math.prod(args["block"]))
    whole = sum(row["us"] for row in totals.values()) or 1.0

    def span(values: set) -> str:
        return "-" if not values else (str(min(values)) if len(values) == 1 else f"{min(values)}–{max(values)}")

    rows = [{"op": name, "ms": row["us"] / 1e3 / calls, "share": row["us"] / whole, "calls": row["count"] / calls,
             "programs": span(row["programs"]), "threads": span(row["threads"])} for name, row in totals.items()]
    rows.sort(key=lambda row: row["ms"], reverse=True)
    return rows


def report(case: Case, n: int, args: argparse.Namespace, device: torch.device, variant: common.Variant) -> None:
    """Profile one case's forward and backward at length ``n`` and print both tables (and with ``--predict`` on CUDA
    each phase's predicted against measured kernels, :mod:`lra.bench.calibrate`)."""
    inputs = case.make_inputs(n)
    leaves = [t for t in inputs if t.requires_grad] + [p for p in (case.module.parameters() if case.module else [])
                                                       if p.requires_grad]
    state: dict = {}

    def forward() -> None:
        with torch.no_grad(), common.autocast(device, args.dtype):
            case.forward(*inputs)

    def prepare_backward() -> None:
        for leaf in leaves:
            leaf.grad = None
        with common.autocast(device, args.dtype):
            state["loss"] = objective(case, inputs)

    def backward() -> None:
        state.pop("loss").backward()

    flops_fwd = counters.count_flops(forward)
    flops_bwd = counters.count_flops(lambda: (prepare_backward(), backward())) - flops_fwd
    phases = (("forward", forward, lambda: None, flops_fwd), ("backward", backward, prepare_backward, flops_bwd))
    gpu = roofline.GPUS[args.predict] if args.predict and device.type == "cuda" else None
    predictions = calibrate.predicted(variant, argparse.Namespace(**{**vars(args), "n": n}), args.batch, gpu) if gpu else {}
    for phase, step, prepare, flops in phases:
        seconds, all_rows, busy = profile_phase(step, prepare, args.repeats, args.warmup, device)
        rows = all_rows[:args.top]
        print(f"\n{case.level}/{case.label} n={n} {phase}: {seconds * 1e3:.2f} ms per call, "
              f"{flops / 1e9:.3f} GFLOP, {flops / seconds / 1e9:.1f} GFLOP/s"
              + (f", GPU busy {100 * busy:.0f} % of it" if busy is not None else ""))
        if busy is None:
            print(common.format_table(rows, [
                ("op", "operator", str), ("ms", "self ms", lambda v: f"{v:.2f}"),
                ("share", "share", lambda v: f"{100 * v:.1f} %"), ("calls", "calls", lambda v: f"{v:g}"),
            ]))
            continue
        print(common.format_table(rows, [
            ("op", "kernel", lambda v: v if len(v) <= 90 else v[:87] + "..."), ("ms", "CUDA ms", lambda v: f"{v:.3f}"),
            ("share", "share", lambda v: f"{100 * v:.1f} %"), ("calls", "calls", lambda v: f"{v:g}"),
            ("programs", "programs", str), ("threads", "threads", str),
        ]))
        if gpu is not None:
            calibrate.print_comparison(calibrate.compare(all_rows, predictions.get(phase, {})), gpu)


def run(args: argparse.Namespace) -> None:
    device = common.resolve_device(args.device)
    common.setup_process(args.threads if args.threads is not None else 1)
    common.select_variants(args.variant, [])  # an unknown name fails here, listing the known ones
    targets = [common.Variant(name, tuple(args.overrides)) for name in dict.fromkeys(args.variant)]
    variants = ([common.Variant(common.BASELINE), *[v for v in targets if v.label != common.BASELINE]] if args.softmax
                else targets)
    cases, skipped = build_cases(variants, args.level, args.n, args.batch, args.heads, args.head_dim, device,
                                 common.DTYPES[args.dtype])
    reasons = {row["variant"]: row["reason"] for row in skipped}
    runnable = [variant for variant in targets if variant.label not in reasons]
    if not runnable:
        raise SystemExit("; ".join(f"{variant.label} cannot run here: {reasons[variant.label]}" for variant in targets))
    print(f"[bench] {common.machine_line(common.machine(device))}", flush=True)
    chosen: list[Case] = []  # with --softmax, the SDPA row of each level once, before the first variant at it
    for variant in targets:
        if variant.label in reasons:
            print(f"\n{variant.label} skipped: it cannot run here: {reasons[variant.label]}", flush=True)
            continue
        (target,) = [case for case in cases if case.label == variant.label]
        if args.softmax:
            chosen += [case for case in cases if case.label == common.BASELINE and case.level == target.level
                       and not any(case is seen for seen in chosen)]
        if not any(target is seen for seen in chosen):
            chosen.append(target)
    if args.predict and device.type != "cuda":
        print(f"[bench] --predict compares with kernels measured on CUDA; on {device} it prints no comparison", flush=True)
    by_label = {variant.label: variant for variant in variants}
    for case in chosen:
        report(case, args.n, args, device, by_label[case.label])
