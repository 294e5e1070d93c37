"""``python -m lra.bench.gpu_check``: the one command to run on a CUDA machine; writes one markdown report.

What it runs (``--dry-run`` prints the plan without a GPU):

1. ``kernels`` — FlashCUR vs CUR (:func:`attention.cur.cur_attention`, same indices) forward and
   backward on CUDA in fp32 and bf16 for every supported m (16..128) and head dims 32/64/128, with
   the launch configuration (:func:`kernels.cur.launch.launch_config`) each shape used; fp32 must agree to
   1e-3 (output) / 1e-2 (gradients) relative, bf16 to 5e-2. Then FlashL1 vs the PyTorch L1 path
   (:mod:`lra.bench.gpu_check_l1`: :meth:`attention.l1.L1Attention.materialised`, L1 weights times ``V``) forward and backward
   in fp32 and bf16 for a few (n, d), n odd and even, padded keys, to the same tolerances.
2. ``meta`` — ``tests/runtime/test_device_hygiene.py``: every variant's forward, loss and backward on the ``meta``
   device, failing on any host sync or host-made tensor (with CUDA present, FlashCUR builds as on a GPU run).
3. ``compile`` — ``torch.compile`` on CUDA: every variant's compiled training step against its eager one
   (:func:`lra.bench.compile_check.compare`, fp32, dropout off, relative error <= 1e-5 of outputs, loss and
   gradients), ``lra.bench compile_breaks --device cuda`` (graphs and graph breaks per variant), and
   ``--compile-steps`` (20) ``trainer=gpu model.compile=true`` steps of softmax and curformer through
   ``lra.train``.
4. ``bench-attention`` — ``python -m lra.bench attention`` (SDPA flash, CUR, FlashCUR, every variant)
   at ``--n`` (1K–16K), fp32 and bf16.
5. ``bench-train`` — ``python -m lra.bench train --task listops`` at the same n.
6. ``train`` — ``--steps`` (300) ``trainer=gpu`` steps of every ``configs/attention/*.yaml`` on a
   small generated ListOps (``task=listops_small``), test accuracy and samples/s from ``results.json``.

Each step's outcome, timing and output tail go to ``<out>/report.md`` (``--out``, default
``outputs/gpu_check/<timestamp>/``); a failing step is reported and the next one still runs; the exit code
is 1 when any step failed. Without CUDA: one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from lra import REPO_ROOT
from lra.bench.gpu_check_l1 import L1_SHAPES, flashl1_checks

STEPS = ("kernels", "meta", "compile", "bench-attention", "bench-train", "train")
COMPILED_TRAINING = ("softmax", "curformer")  # the variants the compile step also trains through lra.train
DEFAULT_N = [1024, 2048, 4096, 8192, 16384]
KERNEL_SHAPES = [(m, d) for m in (16, 32, 64, 128) for d in (32, 64, 128)]
TOLERANCE = {"fp32": (1e-3, 1e-2), "bf16": (5e-2, 5e-2)}  # relative (output, gradients)


@dataclass
class Step:
    """One entry of the plan: a name, what it does, and a command line (``None``: runs in-process)."""

    name: str
    title: str
    command: list[str] | None = None
    status: str = "not run"
    seconds: float = 0.0
    details: list[str] = field(default_factory=list)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lra.bench.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="report folder (default outputs/gpu_check/<timestamp>/)")
    parser.add_argument("--n", type=int, nargs="+", default=DEFAULT_N, help="sequence lengths for the benchmarks")
    parser.add_argument("--steps", type=int, default=300, help="training steps per variant")
    parser.add_argument("--compile-steps", type=int, default=20, help="compiled training steps (compile step)")
    parser.add_argument("--variants", nargs="+", default=None, help="configs/attention names (default: all)")
    parser.add_argument("--only", nargs="+", choices=STEPS, default=list(STEPS), help="run these steps only")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU needed)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.compile_steps < 1 or any(n < 16 for n in args.n):
        parser.error(f"--steps and --compile-steps must be >= 1 and every --n >= 16 (got --steps {args.steps}, "
                     f"--compile-steps {args.compile_steps}, --n {args.n})")
    args.out = args.out or REPO_ROOT / "outputs" / "gpu_check" / datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")
    args.variants = args.variants or sorted(p.stem for p in (REPO_ROOT / "configs" / "attention").glob("*.yaml"))
    return args


def plan(args: argparse.Namespace) -> list[Step]:
    """The steps ``args`` asks for, with their exact command lines."""
    py, n = [sys.executable, "-m"], [str(x) for x in args.n]
    bench = ["--device", "cuda", "--variants", *args.variants]
    data = f"task.data_dir={args.out / 'data' / 'listops_small'}"
    steps = {
        "kernels": [Step("kernels", f"FlashCUR vs CUR forward/backward, fp32 + bf16, (m, d) in {KERNEL_SHAPES}; "
                                    f"FlashL1 vs PyTorch L1, (n, d) in {[(n, d) for n, d, *_ in L1_SHAPES]}")],
        "meta": [Step("meta", "every variant's training step on the meta device: no host sync (tests/runtime/test_device_hygiene.py)",
                      [*py, "pytest", "-q", "-p", "no:cacheprovider", "tests/runtime/test_device_hygiene.py"])],
        "compile": [
            Step("compile", f"compiled vs eager training step on CUDA, fp32, of {', '.join(args.variants)}"),
            Step("compile", "graphs and graph breaks per variant (torch._dynamo.explain)",
                 [*py, "lra.bench", "compile_breaks", *bench, "--out", str(args.out / "compile_breaks")]),
            *(Step("compile", f"{args.compile_steps} trainer=gpu model.compile=true steps of {variant} on listops_small", [
                *py, "lra.train", "task=listops_small", data, "trainer=gpu", "model.compile=true", f"attention={variant}",
                f"trainer.max_steps={args.compile_steps}", f"task.eval_every={args.compile_steps}", "task.warmup_steps=1",
                "logger=csv", f"hydra.run.dir={args.out / 'compile' / variant}",
            ]) for variant in COMPILED_TRAINING if variant in args.variants),
        ],
        "bench-attention": [
            Step("bench-attention", f"lra.bench attention {dtype}, n = {n}",
                 [*py, "lra.bench", "attention", *bench, "--dtype", dtype, "--n", *n, "--out", str(args.out / f"bench_attention_{dtype}")])
            for dtype in ("fp32", "bf16")
        ],
        "bench-train": [Step("bench-train", f"lra.bench train listops, n = {n}",
                             [*py, "lra.bench", "train", *bench, "--task", "listops", "--n", *n, "--out", str(args.out / "bench_train")])],
        "train": [
            Step("train", f"{args.steps} trainer=gpu steps of {variant} on listops_small", [
                *py, "lra.train", "task=listops_small", data, "trainer=gpu",
                f"attention={variant}", f"trainer.max_steps={args.steps}", f"task.eval_every={args.steps}",
                f"task.warmup_steps={max(1, args.steps // 10)}", "logger=csv", f"hydra.run.dir={args.out / 'train' / variant}",
            ])
            for variant in args.variants
        ],
    }
    return [step for name in STEPS if name in args.only for step in steps[name]]


def kernel_checks() -> list[str]:
    """:func:`flashcur_checks` then :func:`lra.bench.gpu_check_l1.flashl1_checks` (both run): their tables, one
    after the other; raises at the end with every failing one's message (and the passing tables)."""
    tables, errors = [], []
    for check in (flashcur_checks, flashl1_checks):
        try:
            tables.append(check())
        except AssertionError as error:
            errors.append(str(error))
    rows = [row for table in tables for row in ["", *table]][1:]
    if errors:
        passed = ["\n".join(rows)] if rows else []
        raise AssertionError("\n\n".join(errors + passed))
    return rows


def flashcur_checks() -> list[str]:
    """FlashCUR vs CUR on CUDA per dtype and shape: one markdown table row each; raises if any is off."""
    import torch

    from attention.cur import cur_attention
    from attention.flashcur import flashcur_attention
    from attention.selection import select_indices
    from kernels.common.launch import device_capability
    from kernels.cur import launch

    rows, failed = ["| dtype | m | d | n | out rel. err | grad rel. err | launch (rv_fwd) |", "|---|---|---|---|---|---|---|"], []
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for m, d in KERNEL_SHAPES:
            n = 4 * m + 7
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(2, 2, n, d, device="cuda", generator=gen).to(dtype).requires_grad_() for _ in range(3))
            mask = torch.ones(2, n, dtype=torch.bool, device="cuda")
            mask[-1, n - 5:] = False
            index_q, index_k = select_indices(q.detach(), k.detach(), mask, m, "abs")
            results = []
            for attend in (flashcur_attention, cur_attention):
                out = attend(q, k, v, mask, index_q, index_k)
                grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
                results.append((out.float(), torch.cat([g.float().flatten() for g in grads])))
            (out, grad), (ref, ref_grad) = results
            err = ((out - ref).norm() / ref.norm()).item()
            grad_err = ((grad - ref_grad).norm() / ref_grad.norm()).item()
            config = launch.launch_config("_rv_fwd", n, m, d, dtype, device_capability(q.device))
            rows.append(f"| {dtype_name} | {m} | {d} | {n} | {err:.2e} | {grad_err:.2e} | {config.options} |")
            if not (err <= TOLERANCE[dtype_name][0] and grad_err <= TOLERANCE[dtype_name][1]):
                failed.append(f"{dtype_name} m={m} d={d}")
    if failed:
        raise AssertionError(f"FlashCUR differs from CUR beyond {TOLERANCE} for: {', '.join(failed)}\n" + "\n".join(rows))
    return rows


def compile_checks(variants: list[str]) -> list[str]:
    """:func:`lra.bench.compile_check.compare` on CUDA for each variant (n = 160 and 131, so CUR's 64 landmarks
    approximate): one markdown row each (relative errors, graphs compiled, first compiled step's seconds);
    raises at the end when any is off, compiled nothing or failed."""
    import torch

    from lra.bench.compile_check import TOLERANCE, compare
    from lra.config import compose_config

    rows = ["| variant | logits | loss | gradients (worst) | tensors | graphs | 1st compiled step s |",
            "|---|---|---|---|---|---|---|"]
    failed = []
    for variant in variants:
        try:
            result = compare(compose_config(["task=listops_small", f"attention={variant}"]), torch.device("cuda"), lengths=(160, 131))
        except Exception as error:  # one variant's failure is its row; the others still run
            rows.append(f"| {variant} | failed: {type(error).__name__}: {str(error).splitlines()[0][:200]} | | | | | |")
            failed.append(variant)
            continue
        rows.append(f"| {variant} | {result['logits']:.1e} | {result['loss']:.1e} | {result['grads']:.1e} "
                    f"({result['worst']}) | {result['tensors']} | {result['graphs']} | {result['compile_s']:.1f} |")
        if max(result["logits"], result["loss"], result["grads"]) > TOLERANCE or result["graphs"] < 1:
            failed.append(variant)
    if failed:
        raise AssertionError(f"compiled differs from eager beyond {TOLERANCE} (or failed) for: {', '.join(failed)}\n"
                             + "\n".join(rows))
    return rows


def run_step(step: Step, variants: list[str] = ()) -> None:
    """Run ``step`` (subprocess, or in-process: the kernel checks, or :func:`compile_checks` of ``variants``),
    filling its status, time and details; never raises."""
    started = time.perf_counter()
    try:
        if step.command is None:
            step.details = compile_checks(list(variants)) if step.name == "compile" else kernel_checks()
            step.status = "ok"
        else:
            proc = subprocess.run(step.command, cwd=REPO_ROOT, capture_output=True, text=True)
            step.status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
            step.details = [f"`{' '.join(step.command)}`", "", "```", *(proc.stdout + proc.stderr)[-3000:].splitlines(), "```"]
            results = next((Path(a.split("=", 1)[1]) for a in step.command if a.startswith("hydra.run.dir=")), None)
            if results is not None and (results / "results.json").exists():
                record = json.loads((results / "results.json").read_text())
                step.details.insert(0, f"test acc {record.get('test_acc')}, samples/s {record.get('samples_per_s')}, steps {record.get('steps')}")
    except Exception as error:  # reported in the file, the next step still runs
        step.status = f"failed ({type(error).__name__})"
        step.details = str(error).splitlines()
    step.seconds = time.perf_counter() - started


def write_report(path: Path, steps: list[Step], environment: dict[str, str]) -> None:
    """One markdown file: environment, a summary table, then each step's details."""
    lines = ["# GPU check", "", *(f"- {key}: {value}" for key, value in environment.items()), "",
             "| step | what | status | seconds |", "|---|---|---|---|"]
    lines += [f"| {s.name} | {s.title} | {s.status} | {s.seconds:.0f} |" for s in steps]
    for step in steps:
        lines += ["", f"## {step.name}: {step.title}", "", f"Status: {step.status}", "", *step.details]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    steps = plan(args)
    if args.dry_run:
        print("\n".join(f"{s.name}: {s.title}" + (f"\n    {' '.join(s.command)}" if s.command else "") for s in steps))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("lra.bench.gpu_check needs a CUDA GPU (torch.cuda.is_available() is False); use --dry-run to see the plan", file=sys.stderr)
        return 2
    environment = {"GPU": torch.cuda.get_device_name(), "capability": str(torch.cuda.get_device_capability()),
                   "torch": torch.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds")}
    for step in steps:
        print(f"[gpu_check] {step.name}: {step.title}", flush=True)
        run_step(step, args.variants)
        write_report(args.out / "report.md", steps, environment)
    print(f"[gpu_check] report: {args.out / 'report.md'}")
    return 0 if all(s.status == "ok" for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
