"""``python -m lra.bench profile --variant V --n N``: where one variant's time goes, operator by operator.

Builds the row that ``python -m lra.bench attention`` measures for ``V`` (:func:`lra.bench.cases.build_cases`:
the attention core for a drop-in variant, the one-layer model otherwise; eval mode, no dropout) and runs it
under ``torch.profiler`` (CPU activity; one thread unless ``--threads``), in two phases profiled apart:

* **forward** — ``--repeats`` forwards under ``torch.no_grad`` (what ``fwd_s`` times);
* **backward** — ``--repeats`` backwards of ``out.sum()`` (+ auxiliary losses), each after an unprofiled
  forward with autograd on (the part ``fwdbwd_s`` adds to a forward).

Per phase it prints the wall time per call, the FLOPs of one call (``FlopCounterMode``, as the attention
benchmark counts them) and the FLOP/s they reach, then the ``--top`` ATen operators by self time: ms per
call, share of the phase's profiled self time, calls per call of the phase. ``--softmax`` adds the same for
the SDPA row, to compare against. Nothing is written to disk.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from lra.bench import common
from lra.bench.attention import objective
from lra.bench.cases import Case, build_cases


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", required=True, help="a configs/attention/*.yaml name, e.g. curformer")
    parser.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help="the variant's own config keys, e.g. num_landmarks=128")
    parser.add_argument("--n", type=int, default=4096, help="sequence length")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--level", choices=["auto", "layer"], default="auto", help="as for the attention benchmark")
    parser.add_argument("--warmup", type=int, default=1, help="unprofiled calls before each phase")
    parser.add_argument("--repeats", type=int, default=3, help="profiled calls per phase")
    parser.add_argument("--top", type=int, default=15, help="operators listed per phase")
    parser.add_argument("--softmax", action="store_true", help="profile the SDPA row too")


def profile_phase(step, prepare, calls: int, warmup: int, top: int) -> tuple[float, list[dict]]:
    """Median wall seconds of ``step()`` over ``calls`` profiled calls and its ``top`` operators by self CPU
    time (ms and calls per call of ``step``, share of its profiled self time); ``prepare()`` runs before each
    call, outside the profiler and the timer."""
    for _ in range(warmup):
        prepare()
        step()
    seconds, totals = [], {}
    for _ in range(calls):
        prepare()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - start)
        for event in prof.key_averages():
            us, count = totals.get(event.key, (0.0, 0))
            totals[event.key] = (us + event.self_cpu_time_total, count + event.count)
    whole = sum(us for us, _ in totals.values()) or 1.0
    rows = [{"op": key, "ms": us / 1e3 / calls, "share": us / whole, "calls": count / calls}
            for key, (us, count) in totals.items() if us > 0]
    rows.sort(key=lambda row: row["ms"], reverse=True)
    return sorted(seconds)[len(seconds) // 2], rows[:top]


def report(case: Case, n: int, args: argparse.Namespace, device: torch.device) -> None:
    """Profile one case's forward and backward at length ``n`` and print both tables."""
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

    flops_fwd = common.count_flops(forward)
    flops_bwd = common.count_flops(lambda: (prepare_backward(), backward())) - flops_fwd
    phases = (("forward", forward, lambda: None, flops_fwd), ("backward", backward, prepare_backward, flops_bwd))
    for phase, step, prepare, flops in phases:
        seconds, rows = profile_phase(step, prepare, args.repeats, args.warmup, args.top)
        print(f"\n{case.level}/{case.label} n={n} {phase}: {seconds * 1e3:.2f} ms per call, "
              f"{flops / 1e9:.3f} GFLOP, {flops / seconds / 1e9:.1f} GFLOP/s")
        print(common.format_table(rows, [
            ("op", "operator", str), ("ms", "self ms", lambda v: f"{v:.2f}"),
            ("share", "share", lambda v: f"{100 * v:.1f} %"), ("calls", "calls", lambda v: f"{v:g}"),
        ]))


def run(args: argparse.Namespace) -> None:
    device = common.resolve_device(args.device)
    common.setup_process(args.threads if args.threads is not None else 1)
    common.select_variants([args.variant], [])  # an unknown name fails here, listing the known ones
    variant = common.Variant(args.variant, tuple(args.overrides))
    variants = [common.Variant(common.BASELINE), variant] if args.softmax else [variant]
    cases, skipped = build_cases(variants, args.level, args.n, args.batch, args.heads, args.head_dim, device)
    for row in skipped:
        if row["variant"] == variant.label:
            raise SystemExit(f"{variant.label} cannot run here: {row['reason']}")
    (target,) = [case for case in cases if case.label == variant.label]
    chosen = [case for case in cases if case.label == common.BASELINE and case.level == target.level]
    print(f"[bench] {common.machine_line(common.machine(device))}", flush=True)
    for case in [*chosen, target] if args.softmax else [target]:
        report(case, args.n, args, device)
