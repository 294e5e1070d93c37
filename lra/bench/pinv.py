"""``python -m lra.bench pinv``: the pseudo-inverse alone, fused Triton kernels vs its PyTorch form.

For every ``--m`` and ``--problems`` (batch × heads, e.g. 16 = B 8 × H 2): the median latency of the forward
(``torch.no_grad``) and of forward + backward (of ``Z.sum()``) of

* ``fused`` — :func:`kernels.pinv.ops.fused_pinv`, what :func:`attention.pinv.iterative_pinv` runs on CUDA
  (one op forward, one backward: four kernels; CUDA only, a skipped row elsewhere);
* ``pytorch`` — :func:`attention.pinv.pytorch_pinv`, its ``pytorch`` form (on CUDA: about ``4·n_iter``
  batched matmuls forward and ``8·n_iter`` backward, plus the norms);

on the same float32 row-softmax matrices (CUR's ``U``), ``--iters`` steps, per_head init. ``launches_fwd`` and
``launches_fwdbwd`` count the pseudo-inverse's dispatched ops that are neither views nor allocations (on the
``meta`` device, the CUDA path's dispatch; also where the row is skipped), ``speedup_*`` is the PyTorch form's
time over the row's. ``error_fwd`` and ``error_grad``: the row's ``Z`` and ``∂⟨Z, P⟩/∂A`` (``P`` a fixed random
probe) on ``I + 0.3·N/√m`` (``N`` standard normal; a softmax matrix's row sums tie, and the norm's gradient then
follows rounding to one tied row or another) against the PyTorch form in float64, as a share of the reference's
largest entry, beside ``bound``, the
kernels' test tolerance ``4·m·u`` (``u = 2⁻²⁴``): on a GPU this checks what the interpreter cannot (the fused
kernels' barriers between a product's stores and its loads, the hardware's 3xTF32 dots). Writes ``pinv.csv`` under
``--out``.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attention.pinv import pytorch_pinv
from kernels.pinv.launch import MAX_M
from kernels.pinv.ops import fused_pinv
from lra.bench import common

COLUMNS = ["form", "m", "problems", "iters", "device", "status", "reason", "fwd_s", "fwdbwd_s", "speedup_fwd",
           "speedup_fwdbwd", "launches_fwd", "launches_fwdbwd", "error_fwd", "error_grad", "bound",
           *common.MACHINE_COLUMNS]
UNIT = 2.0**-24  # float32 unit roundoff
FORMS = {"fused": fused_pinv, "pytorch": pytorch_pinv}
NOT_LAUNCHES = {"view", "reshape", "_unsafe_view", "expand", "transpose", "t", "empty", "empty_like", "new_empty",
                "detach", "alias", "_to_copy", "unsqueeze", "squeeze", "lift_fresh"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--m", type=int, nargs="+", default=[32, 64], help=f"matrix sizes (1..{MAX_M} for fused)")
    parser.add_argument("--problems", type=int, nargs="+", default=[16, 256, 1024],
                        help="matrices per call (batch × heads)")
    parser.add_argument("--iters", type=int, default=6, help="Newton–Schulz steps (attention.pinv_iters)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before timing")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls (the median is reported)")
    parser.add_argument("--out", default=None, help="output folder (default: outputs/bench/<timestamp>/)")


class LaunchCounter(TorchDispatchMode):
    """Counts dispatched ops that launch work: views and allocations left out."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket.__name__ not in NOT_LAUNCHES
        return func(*args, **(kwargs or {}))


def launches(form, m: int, problems: int, iters: int) -> tuple[int, int]:
    """Forward and forward + backward launches of ``form`` on ``meta`` (the CUDA path's dispatch)."""
    a = torch.empty(problems, m, m, device="meta", requires_grad=True)
    with LaunchCounter() as forward:
        z = form(a, iters)
    grad = torch.empty_like(z)
    with LaunchCounter() as backward:
        z.backward(grad)
    return forward.count, forward.count + backward.count


def errors(form, problems: int, m: int, iters: int, device: torch.device) -> dict:
    """``error_fwd``, ``error_grad`` and ``bound`` of ``form`` on ``problems`` matrices ``m × m`` (module doc)."""
    noise = torch.randn(problems, m, m, generator=torch.Generator().manual_seed(2))
    matrices = (torch.eye(m) + 0.3 * noise / m**0.5).to(device)
    exact = matrices.double().requires_grad_()
    reference = pytorch_pinv(exact, iters)
    probe = torch.randn(reference.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (reference_grad,) = torch.autograd.grad((reference * probe.to(reference.device)).sum(), exact)
    leaf = matrices.clone().requires_grad_()
    z = form(leaf, iters)
    (grad,) = torch.autograd.grad((z * probe.to(z)).sum(), leaf)
    return {"error_fwd": common.relative_error(z.double(), reference),
            "error_grad": common.relative_error(grad.double(), reference_grad),
            "bound": 4 * matrices.shape[-1] * UNIT}


def measure(form, matrices: torch.Tensor, args: argparse.Namespace, device: torch.device) -> dict:
    leaf = matrices.clone().requires_grad_()

    def forward() -> None:
        with torch.no_grad():
            form(leaf, args.iters)

    def forward_backward() -> None:
        leaf.grad = None
        form(leaf, args.iters).sum().backward()

    return {"fwd_s": common.median_seconds(forward, device, args.warmup, args.repeats),
            "fwdbwd_s": common.median_seconds(forward_backward, device, args.warmup, args.repeats)}


def run(args: argparse.Namespace) -> list[dict]:
    """Time both forms at every (m, problems); write the CSV, print the table; returns the rows."""
    device = common.resolve_device(args.device)
    if args.iters < 1 or min(args.m) < 1 or min(args.problems) < 1:
        raise ValueError(f"--iters, --m and --problems must be >= 1, got {args.iters}, {args.m}, {args.problems}")
    out = Path(args.out) if args.out else common.default_out_dir()
    common.setup_process(args.threads)
    where = common.machine(device)
    print(f"[bench] {common.machine_line(where)}", flush=True)
    rows = []
    for m, problems in itertools.product(args.m, args.problems):
        logits = 2 * torch.randn(problems, m, m, generator=torch.Generator().manual_seed(0))
        matrices = torch.softmax(logits, -1).to(device)
        for name, form in FORMS.items():
            row = {"form": name, "m": m, "problems": problems, "iters": args.iters, "device": str(device), **where}
            if name == "pytorch" or m <= MAX_M:
                row["launches_fwd"], row["launches_fwdbwd"] = launches(form, m, problems, args.iters)
            if name == "fused" and (device.type != "cuda" or m > MAX_M):
                reason = "the fused kernels need a CUDA device" if device.type != "cuda" else f"m > {MAX_M}"
                row.update(status="skipped", reason=reason)
            else:
                row.update(status="ok", **measure(form, matrices, args, device), **errors(form, problems, m, args.iters, device))
            rows.append(row)
    common.add_ratios([row for row in rows if row["status"] == "ok"], ("m", "problems"),
                      lambda row: row["form"] == "pytorch",
                      {"speedup_fwd": ("fwd_s", True), "speedup_fwdbwd": ("fwdbwd_s", True)})
    common.write_csv(rows, COLUMNS, out / "pinv.csv")
    print(common.format_table(rows, [
        ("m", "m", str), ("problems", "problems", str), ("form", "form", str),
        ("fwd_s", "fwd ms", common.ms), ("speedup_fwd", "fwd ↑", common.times),
        ("fwdbwd_s", "fwd+bwd ms", common.ms), ("speedup_fwdbwd", "fwd+bwd ↑", common.times),
        ("launches_fwd", "launches fwd", str), ("launches_fwdbwd", "launches fwd+bwd", str),
        ("error_fwd", "error Z", lambda v: f"{v:.1e}"), ("error_grad", "error ∂A", lambda v: f"{v:.1e}"),
        ("bound", "4·m·u", lambda v: f"{v:.1e}"), ("reason", "skipped because", str),
    ]))
    print(f"\nmeasured on {common.machine_line(where)}\nwrote {out / 'pinv.csv'}")
    return rows
