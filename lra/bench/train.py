"""``python -m lra.bench train``: training / inference throughput and peak memory of each variant's real model.

For every n and every variant of ``configs/attention/`` (the composed config decides the model: our
2-layer encoder, Proxyformer's, or MEGA's block), a fresh process (:mod:`lra.bench.train_worker`)
trains on synthetic batches of the task's shape (random ids in ``task.vocab_size``, full masks,
``(B, 2, n)`` for two-document tasks) and reports samples/s, inference samples/s and memory.
Ratios are against two references of the same run, n and compile setting, in the papers' format (CUR
paper Table 2: ``Speed ↑``, ``Peak memory ↓`` as ×; Proxyformer Table 2: inference throughput): the papers'
"Transformer" (``softmax_materialised``: the n×n weights stored; ``speed_vs_transformer``,
``mem_vs_transformer``) and their "FlashAttention" (``softmax``, torch SDPA: ``speed_ratio``, ``mem_ratio``).

``--compile`` adds, for every variant, a row ``<variant>+compile`` whose model is compiled with
``torch.compile`` (``model.compile=true``, as ``lra.train`` compiles it), with ``compile_speedup``: its
training samples/s over the same variant's eager samples/s (compilation itself is in ``first_step_s``,
outside the timed steps); compiled rows' ratios are against the compiled references.

FLOPs: ``train_flops`` is one training step's (forward + backward, counted on the eager model by
``FlopCounterMode``: matmuls, convolutions and SDPA; elementwise ops are not counted), ``train_flops_per_s``
what the timed steps achieve, beside ``matmul_flops_per_s``: a 2048² matrix product on the same device,
dtype and threads (``flops_utilisation`` = their ratio), so the distance to the machine's limit shows.

Peak memory is CUDA ``max_memory_allocated`` on GPU; on CPU, bytes saved for backward + parameters,
gradients and AdamW state (the process's peak RSS is reported beside it, ``RSS ↓``). A variant
whose process fails (e.g. FlashCUR without CUDA, out of memory, ``--timeout``) is listed as
skipped with the reason. Writes ``train.csv`` and ``train.png`` under ``--out``. ``--layers`` sets
``model.num_layers`` (every encoder config has it: ours, Luna's, Proxyformer's, MEGA's); ``--experiment NAME``
composes every row with ``experiment=NAME``, so each variant takes that table's own settings
(``configs/experiment_rows/NAME/<variant>.yaml``, e.g. Performer-128 and Luna-128 for ``proxyformer_table1``).

``--inference`` is Proxyformer's Table 2 instead (:mod:`lra.bench.inference`): 6 layers, n 2048 and 4096 by
default, inference only (no optimizer, no training step), memory per sequence and throughput against the
Transformer, in that paper's format; writes ``inference.csv``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from lra import REPO_ROOT
from lra.config import CONFIG_DIR, OverridesRefused, compose_config
from lra.bench import common, inference

COLUMNS = [
    "task", "variant", "compiled", "n", "batch", "steps", "device", "dtype", "threads", "status", "reason",
    "train_samples_per_s", "speed_vs_transformer", "mem_vs_transformer", "speed_ratio", "compile_speedup",
    "peak_mem_bytes", "mem_ratio", "infer_samples_per_s",
    "infer_ratio", "saved_bytes", "state_bytes", "rss_peak_bytes", "rss_delta_bytes", "rss_ratio", "train_step_s",
    "first_step_s", "train_flops", "train_flops_per_s", "matmul_flops_per_s", "flops_utilisation", "params", "layers",
    *[column for column in common.MACHINE_COLUMNS if column != "threads"],
]
COMPILED_SUFFIX = "+compile"  # the label of a variant's compiled row (--compile)
RATIOS = {  # against SDPA softmax (the papers' "FlashAttention")
    "speed_ratio": ("train_samples_per_s", False), "mem_ratio": ("peak_mem_bytes", False),
    "infer_ratio": ("infer_samples_per_s", False), "rss_ratio": ("rss_delta_bytes", False),
}
TRANSFORMER_RATIOS = {"speed_vs_transformer": ("train_samples_per_s", False), "mem_vs_transformer": ("peak_mem_bytes", False)}
LENGTHS = [1024, 2048, 4096]  # --n without --inference


def reference(name: str):
    """Whether a row is the reference ``name`` at its own compile setting (``softmax`` or ``softmax+compile``)."""
    return lambda row: row["variant"].removesuffix(COMPILED_SUFFIX) == name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="text", help="a configs/task/*.yaml name (sets vocab, classes, head)")
    parser.add_argument("--n", type=int, nargs="+", default=None,
                        help=f"sequence lengths (task.max_length; default {' '.join(map(str, LENGTHS))}, with --inference "
                             f"{' '.join(map(str, inference.LENGTHS))})")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20, help="timed training steps (and inference forwards)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per (variant, n) before it is skipped")
    parser.add_argument("--compile", action="store_true",
                        help="also time every variant compiled (model.compile=true): rows <variant>+compile")
    parser.add_argument("--layers", type=int, default=None,
                        help=f"model.num_layers (default: the model config's, with --inference {inference.LAYERS})")
    parser.add_argument("--experiment", default=None,
                        help="a configs/experiment/*.yaml name composed into every row (its per-row settings, "
                             "configs/experiment_rows/<name>/<variant>.yaml), e.g. proxyformer_table1")
    parser.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help="Hydra overrides for every row, after the variant's, e.g. model.d_model=512 model.num_heads=8")
    parser.add_argument("--inference", action="store_true",
                        help="Proxyformer Table 2: inference only, memory per sequence and throughput × the Transformer "
                             "(lra.bench.inference)")


def run_worker(spec: dict, timeout: float, module: str = "lra.bench.train_worker") -> dict:
    """Run ``module`` (:mod:`lra.bench.train_worker`, or :mod:`lra.bench.inference`) on ``spec`` in a fresh Python;
    its result, or a skipped status."""
    with tempfile.TemporaryDirectory(prefix="lra-bench-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps({**spec, "result": str(result_path)}))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
        try:
            proc = subprocess.run([sys.executable, "-m", module, str(spec_path)], check=False,
                                  cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"status": "skipped", "reason": f"over --timeout {timeout:g} s"}
        if proc.returncode == 0:
            return {"status": "ok", **json.loads(result_path.read_text())}
    if proc.returncode < 0:
        return {"status": "skipped", "reason": f"killed by signal {-proc.returncode} (out of memory? lower --batch)"}
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return {"status": "skipped", "reason": lines[-1] if lines else f"exit code {proc.returncode}"}


def layers(args: argparse.Namespace) -> int | None:
    """``--layers``, else 6 with ``--inference`` (:data:`lra.bench.inference.LAYERS`), else None (the config's)."""
    return args.layers or (inference.LAYERS if args.inference else None)


def row_overrides(args: argparse.Namespace, n: int, variant: common.Variant, compiled: bool) -> list[str]:
    """The Hydra overrides of one row: task and length, ``--experiment``, the variant, compile, layers, ``--overrides``."""
    return [f"task={args.task}", f"task.max_length={n}", *([f"experiment={args.experiment}"] if args.experiment else []),
            *variant.config_overrides(), *(["model.compile=true"] if compiled else []),
            *([f"model.num_layers={layers(args)}"] if layers(args) else []), *args.overrides]


def check_flags(args: argparse.Namespace, lengths: list[int], variants: list[common.Variant]) -> None:
    """Refuse bad flags before any worker runs or anything is written: ``--compile`` with ``--inference``, lengths
    or ``--layers`` below 1, an ``--experiment`` with no config, and overrides that do not compose (the first row's
    config is composed here)."""
    if args.inference and args.compile:
        raise ValueError("--compile with --inference: the inference mode times the eager model only; drop one of them")
    if args.layers is not None and args.layers < 1:
        raise ValueError(f"--layers must be >= 1, got {args.layers}")
    if min(lengths) < 1:
        raise ValueError(f"--n must be >= 1, got {lengths}")
    if args.experiment is not None and not (CONFIG_DIR / "experiment" / f"{args.experiment}.yaml").is_file():
        known = sorted(path.stem for path in (CONFIG_DIR / "experiment").glob("*.yaml"))
        raise ValueError(f"--experiment {args.experiment}: no configs/experiment/{args.experiment}.yaml; available: {known}")
    overrides = row_overrides(args, lengths[0], variants[0], False)
    try:
        compose_config(overrides)
    except OverridesRefused as refusal:  # an unknown key, group or value: name the flags that made the overrides
        raise ValueError(f"the config {' '.join(overrides)} does not compose (check --task, --layers, --overrides): "
                         f"{refusal.reason}") from refusal


def run(args: argparse.Namespace) -> list[dict]:
    """Measure every (variant, n) in its own process, add ratios, write CSV + PNG, print tables; returns the rows."""
    lengths = sorted(args.n or (inference.LENGTHS if args.inference else LENGTHS))
    variants = common.select_variants(args.variants, args.variant_overrides)
    check_flags(args, lengths, variants)
    device = common.resolve_device(args.device)
    out = Path(args.out) if args.out else common.default_out_dir()
    threads = common.setup_process(args.threads)
    where = common.machine(device)  # the workers run on the same machine with the same thread count
    print(f"[bench] {common.machine_line(where)}", flush=True)
    setting = {"task": args.task, "batch": args.batch, "steps": args.steps, "device": str(device), "dtype": args.dtype,
               **where}
    if not args.inference:
        matmul = common.matmul_flops_per_s(device, args.dtype)
        print(f"[bench] a 2048² matrix product: {matmul / 1e9:.1f} GFLOP/s", flush=True)
    rows = []
    for n in lengths:
        for variant in variants:
            for compiled in (False, True) if args.compile else (False,):
                spec = {"overrides": row_overrides(args, n, variant, compiled), "n": n, "batch": args.batch, "steps": args.steps,
                        "warmup": args.warmup, "device": str(device), "dtype": args.dtype, "threads": threads}
                label = variant.label + COMPILED_SUFFIX * compiled
                row = {"variant": label, "compiled": compiled, "n": n, **setting,
                       **({} if args.inference else {"matmul_flops_per_s": matmul}),
                       **run_worker(spec, args.timeout, "lra.bench.inference" if args.inference else "lra.bench.train_worker")}
                print(f"n={n} {label}: {row['status']} {row.get('reason', '')}", flush=True)
                rows.append(row)
    if args.inference:
        return inference.report(rows, out, where, lengths)
    ok = [row for row in rows if row["status"] == "ok"]
    common.add_ratios(ok, ("n", "compiled"), reference(common.BASELINE), RATIOS)
    common.add_ratios(ok, ("n", "compiled"), reference(common.MATERIALISED), TRANSFORMER_RATIOS)
    add_compile_speedups(ok)
    for row in ok:
        row["flops_utilisation"] = row["train_flops_per_s"] / matmul
    common.write_csv(rows, COLUMNS, out / "train.csv")
    if ok:
        plot(ok, out / "train.png", common.machine_line(where))
    memory = "peak CUDA memory" if device.type == "cuda" else "saved-for-backward + params/grads/AdamW"
    for n in lengths:
        print(f"\n{args.task}, n = {n}, batch {args.batch}, {device} {args.dtype} (peak memory: {memory})")
        print(common.format_table([row for row in rows if row["n"] == n], [
            ("variant", "Model", str), ("speed_vs_transformer", "Speed ↑ vs Transformer", common.times),
            ("mem_vs_transformer", "Peak memory ↓ vs Transformer", common.times),
            ("speed_ratio", "Speed ↑ vs SDPA", common.times), ("mem_ratio", "Peak memory ↓ vs SDPA", common.times),
            ("rss_ratio", "RSS ↓", common.times),
            ("infer_ratio", "Inference ↑", common.times),
            ("train_samples_per_s", "train samples/s", lambda v: f"{v:.2f}"),
            *([("compile_speedup", "compiled ↑", common.times), ("first_step_s", "1st step s", lambda v: f"{v:.1f}")]
              if args.compile else []),
            ("train_flops", "GFLOP/step", common.giga), ("train_flops_per_s", "GFLOP/s", common.giga),
            ("flops_utilisation", "of matmul", lambda v: f"{100 * v:.1f} %"),
            ("peak_mem_bytes", "peak MiB", common.mib), ("rss_peak_bytes", "RSS MiB", common.mib),
            ("infer_samples_per_s", "infer samples/s", lambda v: f"{v:.2f}"),
            ("reason", "skipped because", lambda v: v[:90]),
        ]))
    print(f"\nmatmul: a 2048² {args.dtype} matrix product here, {matmul / 1e9:.1f} GFLOP/s")
    print(f"measured on {common.machine_line(where)}\nwrote {out / 'train.csv'}" + (f" and {out / 'train.png'}" if ok else ""))
    return rows


def add_compile_speedups(rows: list[dict]) -> None:
    """``compile_speedup`` of each compiled row: its training samples/s over the eager row of the same variant
    and n (None for eager rows, and where that row is missing)."""
    eager = {(row["variant"], row["n"]): row for row in rows if not row["compiled"]}
    for row in rows:
        base = eager.get((row["variant"].removesuffix(COMPILED_SUFFIX), row["n"])) if row["compiled"] else None
        row["compile_speedup"] = row["train_samples_per_s"] / base["train_samples_per_s"] if base else None


def plot(rows: list[dict], path: Path, where: str) -> Path:
    """Bar charts of the three ratios, one group of bars per n, one bar per variant; the title names the
    machine (``where``: :func:`lra.bench.common.machine_line`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({row["n"] for row in rows})
    labels = list(dict.fromkeys(row["variant"] for row in rows))
    width = 0.8 / len(labels)
    panels = [("speed_ratio", "training speed ↑ (× softmax)"), ("mem_ratio", "peak memory ↓ (× softmax)"),
              ("infer_ratio", "inference throughput ↑ (× softmax)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5))
    colors = plt.get_cmap("tab20").colors
    for ax, (key, title) in zip(axes, panels):
        for i, label in enumerate(labels):
            values = {row["n"]: row[key] for row in rows if row["variant"] == label and row[key] is not None}
            ax.bar([j + i * width for j, n in enumerate(lengths) if n in values], [values[n] for n in lengths if n in values],
                   width, label=label, color=colors[i % len(colors)])
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(lengths))], [f"n={n}" for n in lengths])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set(title=title, yscale="log")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{rows[0]['task']} training benchmark on {rows[0]['device']}: {where}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
