"""``python -m lra.bench rows``: the fused CUR and Nyström forms' rows stage alone, its two forms side by side.

The rows stage is ``R V = softmax(s Q_m Kᵀ + pad mask) V`` for the ``m`` landmark rows (CUR's ``R V``, Nyström's
``k3 V``; :func:`attention.landmark_stages.rows_attention`). ``attention.impl``'s ``Forms.rows`` picks its form on
CUDA from the time model of ``lra.bench plan --predict`` alone (docs/bench.md); this command measures both so a GPU
run can confirm or overturn that choice:

* ``triton`` — FlashCUR's kernel (a) and its backward (CUDA only: a skipped row elsewhere, or where
  :func:`kernels.cur.launch.rows_fit` refuses the shape);
* ``fused`` — the split-K stage: batched GEMMs over the materialised ``n × m`` weights, split over ``n``.

For every ``--n`` at ``--batch``, ``--heads``, ``--head-dim``, ``--landmarks`` in ``--dtype`` (the inputs' own
dtype, as autocast's projections hand them over): the median latency of the forward (``torch.no_grad``) and of
forward + backward, ``speedup_*`` the ``fused`` row's time over the row's, the launches of each (operators
dispatched on ``meta``, the CUDA path, that write a tensor and are neither views nor allocations: a custom op
counts once), and ``error_fwd`` / ``error_grad``: the output's and the input gradients' largest difference from a
float64 dense softmax on the same inputs, as a share of the reference's largest entry. The last sequence's last
quarter is padding. Writes ``rows.csv`` under ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from attention.landmark_stages import rows_attention
from kernels.cur.launch import rows_fit
from lra.bench import common
from lra.bench.launches import LaunchCounter

COLUMNS = ["form", "n", "batch", "heads", "head_dim", "landmarks", "dtype", "device", "status", "reason", "fwd_s",
           "fwdbwd_s", "speedup_fwd", "speedup_fwdbwd", "launches_fwd", "launches_fwdbwd", "error_fwd", "error_grad",
           *common.MACHINE_COLUMNS]
FORMS = ("triton", "fused")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384], help="sequence lengths")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--landmarks", type=int, default=64, help="m, the landmark rows")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before timing")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls (the median is reported)")
    parser.add_argument("--out", default=None, help="output folder (default: outputs/bench/<timestamp>/)")


def inputs(args: argparse.Namespace, n: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, ...]:
    """``q_rows`` ``(B, H, m, d)``, ``k, v`` ``(B, H, n, d)`` (seeded, float64 on the CPU, then cast) and the key mask
    ``(B, n)`` with the last sequence's last quarter padded."""
    generator = torch.Generator().manual_seed(n)
    shape = (args.batch, args.heads)
    q_rows = torch.randn(*shape, args.landmarks, args.head_dim, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(*shape, n, args.head_dim, generator=generator, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(args.batch, n, dtype=torch.bool)
    mask[-1, n - n // 4:] = False
    return (*(x.to(device, dtype) for x in (q_rows, k, v)), mask.to(device))


def launches(form: str, q_rows, k, v, mask) -> tuple[int, int]:
    """Forward and forward + backward launches of ``form`` on ``meta`` tensors shaped like the inputs."""
    meta = [torch.empty(x.shape, dtype=x.dtype, device="meta", requires_grad=True) for x in (q_rows, k, v)]
    meta_mask = torch.ones(mask.shape, dtype=torch.bool, device="meta")
    with LaunchCounter() as counter:
        out = rows_attention(*meta, meta_mask, form)
        counter.phase = "backward"
        out.backward(torch.empty_like(out))
    return counter.counts["forward"], counter.counts["forward"] + counter.counts["backward"]


def errors(form: str, q_rows, k, v, mask) -> dict:
    """``error_fwd`` and ``error_grad`` of ``form`` against float64 dense softmax (module doc)."""
    exact = [x.double().requires_grad_() for x in (q_rows, k, v)]
    scores = (exact[0] @ exact[1].mT / exact[0].shape[-1] ** 0.5).masked_fill(~mask[:, None, None, :], -torch.inf)
    reference = torch.softmax(scores, -1) @ exact[2]
    probe = torch.randn(reference.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    reference_grads = torch.autograd.grad((reference * probe.to(reference.device)).sum(), exact)
    leaves = [x.detach().requires_grad_() for x in (q_rows, k, v)]
    out = rows_attention(*leaves, mask, form)
    grads = torch.autograd.grad((out.double() * probe.to(out.device)).sum(), leaves)
    return {"error_fwd": common.relative_error(out.double(), reference),
            "error_grad": max(common.relative_error(got.double(), want) for got, want in zip(grads, reference_grads))}


def measure(form: str, q_rows, k, v, mask, args: argparse.Namespace, device: torch.device) -> dict:
    leaves = [x.detach().requires_grad_() for x in (q_rows, k, v)]

    def forward() -> None:
        with torch.no_grad():
            rows_attention(*leaves, mask, form)

    def forward_backward() -> None:
        rows_attention(*leaves, mask, form).sum().backward()

    return {"fwd_s": common.median_seconds(forward, device, args.warmup, args.repeats),
            "fwdbwd_s": common.median_seconds(forward_backward, device, args.warmup, args.repeats)}


def skipped(form: str, args: argparse.Namespace, dtype: torch.dtype, device: torch.device) -> str | None:
    """Why ``form`` does not run here (None: it runs)."""
    if form != "triton":
        return None
    if device.type != "cuda":
        return "kernel (a) needs a CUDA device"
    if not rows_fit(args.landmarks, args.head_dim, dtype, device):
        return f"kernel (a) does not take m {args.landmarks}, head dim {args.head_dim} in {dtype}"
    return None


def run(args: argparse.Namespace) -> list[dict]:
    """Time both forms at every ``--n``; write the CSV, print the table; returns the rows."""
    device = common.resolve_device(args.device)
    if min(args.n + [args.batch, args.heads, args.head_dim, args.landmarks]) < 1:
        raise ValueError(f"--n, --batch, --heads, --head-dim and --landmarks must be >= 1, got {args.n}, "
                         f"{args.batch}, {args.heads}, {args.head_dim}, {args.landmarks}")
    dtype = DTYPES[args.dtype]
    out = Path(args.out) if args.out else common.default_out_dir()
    common.setup_process(args.threads)
    where = common.machine(device)
    print(f"[bench] {common.machine_line(where)}", flush=True)
    rows = []
    for n in args.n:
        q_rows, k, v, mask = inputs(args, n, dtype, device)
        for form in FORMS:
            row = {"form": form, "n": n, "batch": args.batch, "heads": args.heads, "head_dim": args.head_dim,
                   "landmarks": args.landmarks, "dtype": args.dtype, "device": str(device), **where}
            row["launches_fwd"], row["launches_fwdbwd"] = launches(form, q_rows, k, v, mask)
            reason = skipped(form, args, dtype, device)
            if reason:
                row.update(status="skipped", reason=reason)
            else:
                row.update(status="ok", **measure(form, q_rows, k, v, mask, args, device),
                           **errors(form, q_rows, k, v, mask))
            rows.append(row)
    common.add_ratios([row for row in rows if row["status"] == "ok"], ("n",), lambda row: row["form"] == "fused",
                      {"speedup_fwd": ("fwd_s", True), "speedup_fwdbwd": ("fwdbwd_s", True)})
    common.write_csv(rows, COLUMNS, out / "rows.csv")
    print(common.format_table(rows, [
        ("n", "n", str), ("form", "form", str),
        ("fwd_s", "fwd ms", common.ms), ("speedup_fwd", "fwd ↑", common.times),
        ("fwdbwd_s", "fwd+bwd ms", common.ms), ("speedup_fwdbwd", "fwd+bwd ↑", common.times),
        ("launches_fwd", "launches fwd", str), ("launches_fwdbwd", "launches fwd+bwd", str),
        ("error_fwd", "error RV", lambda v: f"{v:.1e}"), ("error_grad", "error ∂", lambda v: f"{v:.1e}"),
        ("reason", "skipped because", str),
    ]))
    print(f"\nmeasured on {common.machine_line(where)}\nwrote {out / 'rows.csv'}")
    return rows
