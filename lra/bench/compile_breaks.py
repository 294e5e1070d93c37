"""``python -m lra.bench compile_breaks``: what ``torch.compile`` makes of each variant's network.

For every variant of ``configs/attention/`` the real model (:func:`lra.build.build_model`, train mode, as
``model.compile=true`` compiles it) is traced by ``torch._dynamo.explain`` on a small batch (``--batch``
sequences of ``--n`` random tokens, the second half of the last one padded): the number of graphs, graph
breaks and traced ops, and each break's reason with the line of this repository's code it happened at
(a break repeated at the same line counted once, ``N×``). At a graph break dynamo ends the graph, runs the
code it cannot trace in Python and starts a new graph after it; one graph and no break means the network
compiles whole. Only dynamo runs (no Inductor), so a variant takes seconds. A variant that cannot be
built here (FlashCUR without CUDA) is a ``skipped`` row with the reason, one whose tracing raises a
``failed`` row with the error. Writes ``compile_breaks.csv`` under ``--out``.
"""

from __future__ import annotations

import argparse
import logging
import re
import warnings
from collections import Counter
from pathlib import Path

import torch

from lra import REPO_ROOT
from lra.bench import common
from lra.config import compose_config
from lra.build import build_model

COLUMNS = ["task", "variant", "n", "batch", "device", "dtype", "status", "reason", "graphs", "graph_breaks", "ops",
           "breaks", *common.MACHINE_COLUMNS]
SENTENCE_END = re.compile(r"(?<=[.`])\s+(?=[A-Z])")  # "... `posix.stat.` This function ..." ends after the backtick


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="listops_small", help="a configs/task/*.yaml name (vocab, classes, head)")
    parser.add_argument("--n", type=int, default=64, help="sequence length (task.max_length)")
    parser.add_argument("--batch", type=int, default=2)


def where_in_repo(stack) -> str:
    """``file:line`` of the innermost frame of ``stack`` in this repository's code (torch's own frames and the
    standard library skipped), else of the innermost frame."""
    frames = [frame for frame in stack if Path(frame.filename).is_relative_to(REPO_ROOT)
              and ".venv" not in Path(frame.filename).relative_to(REPO_ROOT).parts]
    frame = (frames or list(stack) or [None])[-1]
    if frame is None:
        return "?"
    path = Path(frame.filename)
    return f"{path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}:{frame.lineno}"


def summary(reason: str) -> str:
    """A break reason in one line: its first line and, where dynamo gives one, the first sentence of its
    ``Explanation:``."""
    lines = [line.strip() for line in reason.strip().splitlines()]
    explanation = next((line.removeprefix("Explanation:").strip() for line in lines if line.startswith("Explanation:")), "")
    return f"{lines[0]}: {SENTENCE_END.split(explanation)[0]}" if explanation else lines[0]


def explain(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, device: torch.device, dtype: str) -> dict:
    """``torch._dynamo.explain`` of ``model(ids, mask)``: graphs, breaks, ops and the breaks' reasons counted."""
    import torch._dynamo

    torch._dynamo.reset()
    with warnings.catch_warnings(), common.autocast(device, dtype):
        warnings.simplefilter("ignore")  # dynamo warns once per untraceable call; the reasons below say it all
        output = torch._dynamo.explain(model)(ids, mask)
    counted = Counter(f"{summary(b.reason)} @ {where_in_repo(b.user_stack)}" for b in output.break_reasons)
    return {"graphs": output.graph_count, "graph_breaks": output.graph_break_count, "ops": output.op_count,
            "breaks": "; ".join(f"{count}× {text}" for text, count in counted.items())}


def trace(cfg, args: argparse.Namespace, device: torch.device) -> dict:
    """:func:`explain` of ``cfg``'s model with ``status: ok``; ``skipped`` with the reason where the model cannot be
    built here, ``failed`` with the error where tracing raises (the next variant still runs)."""
    try:
        model = build_model(cfg).to(device).train()
    except (RuntimeError, ValueError) as error:
        return {"status": "skipped", "reason": str(error).splitlines()[0]}
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.task.vocab_size, (args.batch, args.n), generator=generator).to(device)
    mask = torch.ones(args.batch, args.n, dtype=torch.bool, device=device)
    mask[-1, args.n // 2:] = False
    try:
        return {"status": "ok", **explain(model, ids, mask, device, args.dtype)}
    except Exception as error:
        return {"status": "failed", "reason": f"{type(error).__name__}: {str(error).splitlines()[0]}"}


def run(args: argparse.Namespace) -> list[dict]:
    """One row per variant (traced, skipped or failed); prints the table and each variant's break reasons,
    writes ``compile_breaks.csv``; returns the rows."""
    device = common.resolve_device(args.device)
    out = Path(args.out) if args.out else common.default_out_dir()
    common.setup_process(args.threads)
    where = common.machine(device)
    torch._logging.set_logs(dynamo=logging.ERROR)
    print(f"[bench] {common.machine_line(where)}", flush=True)
    rows = []
    for variant in common.select_variants(args.variants, args.variant_overrides):
        row = {"task": args.task, "variant": variant.label, "n": args.n, "batch": args.batch, "device": str(device),
               "dtype": args.dtype, **where}
        cfg = compose_config([f"task={args.task}", f"task.max_length={args.n}", *variant.config_overrides()])
        rows.append({**row, **trace(cfg, args, device)})
        print(f"{variant.label}: {rows[-1]['status']} {rows[-1].get('reason', '')}", flush=True)
    common.write_csv(rows, COLUMNS, out / "compile_breaks.csv")
    print(f"\n{args.task}, n = {args.n}, batch {args.batch}, {device} {args.dtype}: torch._dynamo.explain of each model")
    print(common.format_table(rows, [
        ("variant", "variant", str), ("status", "status", str), ("graphs", "graphs", str),
        ("graph_breaks", "graph breaks", str), ("ops", "ops", str), ("reason", "skipped / failed because", str),
    ]))
    for row in rows:
        if row.get("breaks"):
            print(f"\n{row['variant']} breaks:\n  " + row["breaks"].replace("; ", "\n  "))
    print(f"\ntraced on {common.machine_line(where)}\nwrote {out / 'compile_breaks.csv'}")
    return rows
