"""``python -m lra.bench train --inference``: Proxyformer's Table 2 (inference memory per sequence and throughput).

Proxyformer (Lee, Lee, Shin, AAAI 2024), §"Implementation Details": "For experiments focusing on inference-time
efficiency, we used a more extensive transformer model featuring six encoder layers, following the structure of
the standard transformer. We recorded the memory usage per sequence and throughput on a single NVIDIA GeForce RTX
3090 GPU." Table 2: "Average memory footprint per one input sequence (MEM) and throughput (TP) results for 2K and 4K
input sequence lengths. The throughput means the number of inputs per seconds. These values are normalized to those
of the standard transformer. The absolute result values of the standard transformer are provided in parentheses."

The paper names no task for Table 2; we use Text (``--task text``: byte-level, vocabulary 257, one document), the
task whose length is 4K in its Table 1. Its "standard transformer" predates FlashAttention, so the reference is
``softmax_materialised`` (the n×n weights stored); SDPA ``softmax`` is one more row.

This module is both halves of the mode. The worker (``python -m lra.bench.inference SPEC.json``, a fresh process
per (variant, n), started by :func:`lra.bench.train.run_worker`) builds the real model with ``model.num_layers`` =
``--layers`` (6 by default in this mode) in eval mode, with no optimizer and no training step, and runs only
``torch.inference_mode`` forwards on synthetic batches of the task's shape:

- **TP**: ``batch`` / the median of ``--steps`` timed forwards after ``--warmup`` (at least 1) untimed ones, in
  sequences per second.
- **MEM**: the peak of tensor memory allocated during one more forward above what was allocated before it (the
  parameters and the input batch), divided by ``batch``. On CUDA ``torch.cuda.max_memory_allocated`` after a
  reset (:func:`lra.bench.common.cuda_peak_bytes`); on CPU the same count from the profiler's allocation events
  (:func:`cpu_peak_bytes`). Parameters are left out because they do not grow with the batch; so is what the
  warm-up left allocated (cuBLAS's workspace on CUDA). The CPU count does not see memory a library takes outside
  torch's allocator (MKL's GEMM packing buffers).
- ``rss_infer_bytes`` (CPU cross-check): the process's peak resident set over the warm-up and timed forwards
  (Linux ``VmHWM``, reset after the model and batch were built) above the resident set then. Only inference runs
  in this process, so no freed training heap hides it; it also counts allocator slack and library buffers.

The runner side (:func:`report`) adds the ratios against the Transformer of the same n and prints the table in the
paper's format: MEM ↓ and TP ↑ per n, the Transformer's row ``1 (<MiB per sequence> MiB)`` and
``1 (<sequences/s>)``; writes ``inference.csv`` under ``--out``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from lra.bench import common
from lra.bench.train_worker import documents_shape, proc_status, reset_peak_rss
from lra.build import build_model
from lra.config import compose_config
from lra.runtime.gpu_setup import fast_float32_matmuls

LENGTHS = [2048, 4096]  # Table 2's "2K" and "4K"
LAYERS = 6  # "a more extensive transformer model featuring six encoder layers"
COLUMNS = [
    "task", "variant", "n", "batch", "steps", "layers", "device", "dtype", "threads", "status", "reason",
    "mem_vs_transformer", "tp_vs_transformer", "mem_per_seq_bytes", "infer_samples_per_s", "infer_step_s",
    "infer_peak_bytes", "rss_infer_bytes", "params", *[c for c in common.MACHINE_COLUMNS if c != "threads"],
]
RATIOS = {"mem_vs_transformer": ("mem_per_seq_bytes", False), "tp_vs_transformer": ("infer_samples_per_s", False)}


def cpu_peak_bytes(fn) -> int:
    """Peak bytes of CPU tensor memory allocated by ``fn()`` above what was allocated before it.

    Runs ``fn`` under ``torch.profiler.profile(profile_memory=True)``, whose ``[memory]`` events are every
    allocation (+bytes) and free (-bytes) through torch's CPU allocator in the window (frees of blocks allocated
    before it report nothing); the peak of their running sum is what CUDA's ``max_memory_allocated`` minus the
    memory allocated before measures on a GPU."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory(prefix="lra-bench-trace-") as tmp:
        prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
        events = json.loads((Path(tmp) / "trace.json").read_text())["traceEvents"]
    live = peak = 0
    for event in sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"]):
        if event["args"].get("Device Type") == 0:  # c10::DeviceType::CPU
            live += event["args"]["Bytes"]
            peak = max(peak, live)
    return peak


def measure(spec: dict) -> dict:
    """One (variant, n): ``spec`` as :mod:`lra.bench.train_worker` reads it; inference only (module doc)."""
    device = torch.device(spec["device"])
    common.setup_process(spec["threads"])
    fast_float32_matmuls(device.type)
    cfg = compose_config(spec["overrides"])
    model = build_model(cfg).to(device).eval()
    batch = spec["batch"]
    shape = (batch, *documents_shape(model), spec["n"])
    ids = torch.randint(0, cfg.task.vocab_size, shape, device=device)
    mask = torch.ones(shape, dtype=torch.bool, device=device)

    def infer() -> None:
        with torch.inference_mode(), common.autocast(device, spec["dtype"]):
            model(ids, mask)

    rss_start = proc_status("VmRSS")
    reset_peak_rss()
    step_s = common.median_seconds(infer, device, max(1, spec["warmup"]), spec["steps"])
    rss_peak = proc_status("VmHWM")
    peak = common.cuda_peak_bytes(infer, device) if device.type == "cuda" else cpu_peak_bytes(infer)
    return {
        "layers": len(model.blocks),
        "params": sum(p.numel() for p in model.parameters()),
        "infer_step_s": step_s,
        "infer_samples_per_s": batch / step_s,
        "infer_peak_bytes": peak,
        "mem_per_seq_bytes": peak / batch,
        "rss_infer_bytes": rss_peak - rss_start if rss_peak is not None and rss_start is not None else None,
    }


def paper_table(rows: list[dict], lengths: list[int]) -> str:
    """Proxyformer's Table 2: per variant, MEM ↓ and TP ↑ per n as × the Transformer (``softmax_materialised``)
    of the same n, the Transformer's own cells ``1 (<MiB per sequence> MiB)`` and ``1 (<sequences/s>)``."""
    labels = sorted(dict.fromkeys(row["variant"] for row in rows), key=lambda label: label != common.MATERIALISED)
    found = {(row["variant"], row["n"]): row for row in rows}
    lines = []
    for label in labels:
        line = {"variant": label}
        for n in lengths:
            row = found.get((label, n), {"status": "not run"})
            if row["status"] != "ok":
                line[f"mem_{n}"] = line[f"tp_{n}"] = "-"
                line["reason"] = f"n={n}: {row.get('reason') or row['status']}"[:90]
            elif label == common.MATERIALISED:
                line[f"mem_{n}"] = f"1 ({common.mib(row['mem_per_seq_bytes'])} MiB)"
                line[f"tp_{n}"] = f"1 ({row['infer_samples_per_s']:.3g})"
            else:
                for key, ratio in ((f"mem_{n}", "mem_vs_transformer"), (f"tp_{n}", "tp_vs_transformer")):
                    line[key] = f"{row[ratio]:.2f}" if row[ratio] is not None else "-"
        lines.append(line)
    columns = [("variant", "Model", str)]
    for n in lengths:
        columns += [(f"mem_{n}", f"MEM ↓ n={n}", str), (f"tp_{n}", f"TP ↑ n={n}", str)]
    return common.format_table(lines, [*columns, ("reason", "skipped because", str)])


def report(rows: list[dict], out: Path, where: dict, lengths: list[int]) -> list[dict]:
    """Ratios against the Transformer of each n, ``inference.csv``, the paper's table and the absolute numbers."""
    ok = [row for row in rows if row["status"] == "ok"]
    common.add_ratios(ok, ("n",), lambda row: row["variant"] == common.MATERIALISED, RATIOS)
    common.write_csv(rows, COLUMNS, out / "inference.csv")
    first, layers = rows[0], "/".join(str(count) for count in sorted({row["layers"] for row in ok})) or "-"
    memory = "CUDA" if first["device"].startswith("cuda") else "CPU"
    print(f"\n{first['task']}, inference only, {layers} layers, batch {first['batch']}, {first['device']} "
          f"{first['dtype']}. MEM: peak {memory} tensor memory of a forward above the model and batch, per sequence; "
          f"TP: sequences/s. Both × the Transformer (softmax_materialised), its absolute value in parentheses:")
    print(paper_table(rows, lengths))
    print("\nabsolute:")
    print(common.format_table(ok, [
        ("variant", "model", str), ("n", "n", str), ("mem_per_seq_bytes", "MiB/sequence", common.mib),
        ("infer_samples_per_s", "sequences/s", lambda v: f"{v:.3g}"),
        ("rss_infer_bytes", "RSS above model MiB", common.mib), ("params", "params", str),
    ]))
    print(f"\nmeasured on {common.machine_line(where)}\nwrote {out / 'inference.csv'}")
    return rows


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m lra.bench.inference SPEC.json (written by python -m lra.bench train --inference)")
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(spec["result"]).write_text(json.dumps(measure(spec)))
