"""``python -m lra.bench attention``: latency, FLOPs, saved-for-backward bytes and memory of every variant vs n.

For each length n and each row of :func:`lra.bench.cases.build_cases` (every config in
``configs/attention/``, at ``core`` or ``layer`` level, plus the references):

* ``fwd_s`` — median forward latency (``torch.no_grad``), ``fwdbwd_s`` — median forward + backward of
  ``out.sum()`` (+ auxiliary losses), each after ``--warmup`` untimed calls, modules in eval mode
  (no dropout: the attention computation itself, as in the CUR paper's Fig. 4);
* ``speedup_fwd``, ``speedup_fwdbwd`` — softmax (SDPA) latency at the same n and level / the row's;
* ``flops_fwd``, ``flops_fwdbwd`` — ``FlopCounterMode`` totals; ``flops_per_s_fwd``, ``flops_per_s_fwdbwd`` —
  those FLOPs over the measured time (how far the row is from ``matmul_flops_per_s``, a 2048² product's
  rate on the same device, dtype and threads, printed first); ``flop_ratio_fwd``, ``flop_ratio_fwdbwd`` —
  softmax's FLOPs / the row's: the speed-up the FLOP count alone predicts, beside the measured one;
* ``speedup_fwd_materialised``, ``speedup_fwdbwd_materialised`` — the same against
  ``softmax_materialised`` (core level only): torch's fused CPU/GPU SDPA never stores the n×n matrix,
  the materialised reference is the "standard attention" of the papers' complexity comparisons;
* ``saved_bytes`` — storages autograd keeps for backward (parameters excluded); ``saved_ratio`` —
  / that of ``softmax_materialised`` (core level only);
* ``peak_mem_bytes`` (CUDA only) — ``max_memory_allocated`` during forward + backward above the
  inputs, ``mem_ratio`` — / softmax's;
* ``fwdbwd_graph_s`` (CUDA only) — median forward + backward replayed as one CUDA graph (:func:`graphed_seconds`:
  captured once after warm-up on a side stream, gradients allocated in the graph's pool), beside the eager
  ``fwdbwd_s``: what launch overhead costs the row; ``speedup_fwdbwd_graph`` — softmax's graphed time / the row's;
  ``graph_reason`` — why a row has no graphed time (no GPU, or the capture failed: a host sync in the code).

Writes ``attention.csv`` and ``attention.png`` (log-log latency and memory vs n) under ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lra.bench import common, counters
from lra.bench.cases import Case, build_cases

COLUMNS = [
    "level", "variant", "n", "batch", "heads", "head_dim", "device", "dtype", "threads", "status", "reason",
    "fwd_s", "fwdbwd_s", "speedup_fwd", "speedup_fwdbwd", "speedup_fwd_materialised", "speedup_fwdbwd_materialised",
    "flops_fwd", "flops_fwdbwd", "flops_per_s_fwd", "flops_per_s_fwdbwd", "flop_ratio_fwd", "flop_ratio_fwdbwd",
    "matmul_flops_per_s",
    "saved_bytes", "saved_ratio", "peak_mem_bytes", "mem_ratio", "fwdbwd_graph_s", "speedup_fwdbwd_graph",
    "graph_reason",
    *[column for column in common.MACHINE_COLUMNS if column != "threads"],
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096, 8192], help="sequence lengths")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--level", choices=["auto", "layer"], default="auto",
                        help="auto: attention core for drop-in variants, one-layer model for the others; "
                             "layer: every variant as a one-layer model")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls before timing")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls (the median is reported)")


def objective(case: Case, inputs: tuple) -> torch.Tensor:
    out, aux = case.forward(*inputs)
    loss = out.float().sum()
    return loss if aux is None else loss + aux


def graphed_seconds(fn, device: torch.device, warmup: int, repeats: int) -> tuple[float | None, str]:
    """``(median seconds, "")`` of ``fn`` captured once as a CUDA graph and replayed, or ``(None, reason)``.

    PyTorch's whole-network capture: ``fn`` runs ``max(warmup, 3)`` times on a side stream first (Triton compiles,
    cuBLAS picks its kernels, the caching allocator settles), then once under ``torch.cuda.graph``; ``fn`` sets the
    gradients to None itself, so the captured backward allocates them from the graph's private pool. Replays then
    launch every kernel of the step at once. A capture that fails (a host sync, a CPU tensor made inside) gives
    its reason instead of a time."""
    if device.type != "cuda":
        return None, "CUDA graphs need a GPU"
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(max(warmup, 3)):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as error:
        return None, f"capture failed: {str(error).splitlines()[0]}"
    return common.median_seconds(graph.replay, device, warmup, repeats), ""


def measure(case: Case, n: int, args: argparse.Namespace, device: torch.device) -> dict:
    """Every metric of one case at length n (see the module docstring)."""
    inputs = case.make_inputs(n)
    params = list(case.module.parameters()) if case.module is not None else []
    leaves = [t for t in inputs if t.requires_grad] + [p for p in params if p.requires_grad]

    def forward() -> None:
        with torch.no_grad(), common.autocast(device, args.dtype):
            case.forward(*inputs)

    def forward_backward() -> None:
        for leaf in leaves:
            leaf.grad = None
        with common.autocast(device, args.dtype):
            loss = objective(case, inputs)
        loss.backward()

    with counters.SavedTensorBytes(exclude=params) as saved, common.autocast(device, args.dtype):
        objective(case, inputs)
    row = {
        "saved_bytes": saved.bytes,
        "fwd_s": common.median_seconds(forward, device, args.warmup, args.repeats),
        "fwdbwd_s": common.median_seconds(forward_backward, device, args.warmup, args.repeats),
        "flops_fwd": counters.count_flops(forward),
        "flops_fwdbwd": counters.count_flops(forward_backward),
        "peak_mem_bytes": common.cuda_peak_bytes(forward_backward, device),
    }
    row["fwdbwd_graph_s"], row["graph_reason"] = graphed_seconds(forward_backward, device, args.warmup, args.repeats)
    row["flops_per_s_fwd"] = row["flops_fwd"] / row["fwd_s"]
    row["flops_per_s_fwdbwd"] = row["flops_fwdbwd"] / row["fwdbwd_s"]
    return row


def run(args: argparse.Namespace) -> list[dict]:
    """Measure every case at every n, add ratios, write CSV + PNG, print the table; returns the rows."""
    device = common.resolve_device(args.device)
    out = Path(args.out) if args.out else common.default_out_dir()
    variants = common.select_variants(args.variants, args.variant_overrides)
    cases, skipped = build_cases(variants, args.level, max(args.n), args.batch, args.heads, args.head_dim, device,
                                 common.DTYPES[args.dtype])
    common.setup_process(args.threads)
    where = common.machine(device)
    print(f"[bench] {common.machine_line(where)}", flush=True)
    matmul = common.matmul_flops_per_s(device, args.dtype)
    print(f"[bench] a 2048² matmul reaches {matmul / 1e9:.1f} GFLOP/s here", flush=True)
    setting = {"batch": args.batch, "head_dim": args.head_dim, "device": str(device), "dtype": args.dtype,
               "matmul_flops_per_s": matmul, **where}
    rows = []
    for n in sorted(args.n):
        for case in cases:
            row = {"level": case.level, "variant": case.label, "n": n, "heads": case.heads, **setting}
            try:
                row.update(status="ok", **measure(case, n, args, device))
            except (RuntimeError, ValueError) as error:  # e.g. out of memory: reported, not fatal
                row.update(status="skipped", reason=str(error).splitlines()[0])
            print(f"n={n} {case.level}/{case.label}: {row['status']}", flush=True)
            rows.append(row)
        rows += [{**skip, "n": n, "heads": args.heads, **setting} for skip in skipped]
    ok = [row for row in rows if row["status"] == "ok"]
    common.add_ratios(ok, ("n", "level"), lambda r: r["variant"] == common.BASELINE,
                      {"speedup_fwd": ("fwd_s", True), "speedup_fwdbwd": ("fwdbwd_s", True),
                       "flop_ratio_fwd": ("flops_fwd", True), "flop_ratio_fwdbwd": ("flops_fwdbwd", True),
                       "mem_ratio": ("peak_mem_bytes", False), "speedup_fwdbwd_graph": ("fwdbwd_graph_s", True)})
    common.add_ratios(ok, ("n", "level"), lambda r: r["variant"] == common.MATERIALISED,
                      {"saved_ratio": ("saved_bytes", False), "speedup_fwd_materialised": ("fwd_s", True),
                       "speedup_fwdbwd_materialised": ("fwdbwd_s", True)})
    common.write_csv(rows, COLUMNS, out / "attention.csv")
    plot(ok, out / "attention.png", device, common.machine_line(where))
    print(common.format_table(rows, [
        ("n", "n", str), ("level", "level", str), ("variant", "variant", str),
        ("fwd_s", "fwd ms", common.ms), ("speedup_fwd", "fwd ↑", common.times),
        ("flop_ratio_fwd", "FLOP ↑ fwd", common.times),
        ("fwdbwd_s", "fwd+bwd ms", common.ms), ("speedup_fwdbwd", "fwd+bwd ↑", common.times),
        ("flop_ratio_fwdbwd", "FLOP ↑ fwd+bwd", common.times),
        ("fwdbwd_graph_s", "graph ms", common.ms), ("speedup_fwdbwd_graph", "graph ↑", common.times),
        ("speedup_fwd_materialised", "fwd ↑ mat.", common.times),
        ("speedup_fwdbwd_materialised", "fwd+bwd ↑ mat.", common.times),
        ("flops_fwd", "GFLOP fwd", common.giga), ("flops_per_s_fwd", "GFLOP/s fwd", common.giga_rate),
        ("flops_fwdbwd", "GFLOP fwd+bwd", common.giga), ("flops_per_s_fwdbwd", "GFLOP/s fwd+bwd", common.giga_rate),
        ("saved_bytes", "saved MiB", common.mib),
        ("saved_ratio", "saved / materialised", lambda v: f"{v:.3f}×"),
        ("peak_mem_bytes", "peak MiB", common.mib), ("reason", "skipped because", lambda v: v[:90]),
    ]))
    print(f"\nmeasured on {common.machine_line(where)}\nwrote {out / 'attention.csv'} and {out / 'attention.png'}")
    return rows


def plot(rows: list[dict], path: Path, device: torch.device, where: str) -> Path:
    """Log-log forward latency and memory vs n, one line per (level, variant) (the CUR paper's Fig. 4);
    the title names the machine (``where``: :func:`lra.bench.common.machine_line`)."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    memory_key, memory_label = (("peak_mem_bytes", "peak CUDA memory (bytes)") if device.type == "cuda"
                                else ("saved_bytes", "bytes saved for backward"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    colors = plt.get_cmap("tab20").colors
    for i, key in enumerate(dict.fromkeys((row["level"], row["variant"]) for row in rows)):
        line = sorted((row for row in rows if (row["level"], row["variant"]) == key), key=lambda r: r["n"])
        style = {"marker": "o", "color": colors[i % len(colors)], "linestyle": "--" if key[0] == "layer" else "-",
                 "label": f"{key[1]} ({key[0]})"}
        left.plot([r["n"] for r in line], [r["fwd_s"] * 1e3 for r in line], **style)
        right.plot([r["n"] for r in line], [r[memory_key] for r in line], **style)
    left.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="forward latency (ms)")
    right.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel=memory_label)
    lengths = sorted({row["n"] for row in rows})
    for ax in (left, right):
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xticks(lengths, [str(n) for n in lengths])
    right.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(f"attention benchmark on {device}: {where}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
