"""``python -m lra.bench launches``: the kernels one attention layer's forward + backward launches on the GPU path.

On a GPU an attention layer of LRA's size is bound by kernel launches (several µs each), not by arithmetic, so
the number of kernels a layer launches is a measure of its GPU speed that needs no GPU. For every variant of
``configs/attention/`` a one-layer model of the Text task (``--n`` tokens, ``--batch`` sequences, ``--heads`` ×
``--head-dim``, ``attention.num_landmarks`` = ``--landmarks`` where the variant has that key) runs one forward
on PyTorch's ``meta`` device (shapes and dtypes, no values: what a GPU tensor looks like from the host), which
records the arguments its attention module (the config's ``_target_``) is called with. That module alone then
runs forward and backward (``torch.autograd.grad`` of its output, in eval mode) under :class:`LaunchCounter`.
On ``meta`` the code takes the branches it takes on CUDA (the CPU kernels run for CPU tensors only).

What counts as a launch (:class:`LaunchCounter`): every ATen operator dispatched that writes a tensor and is neither
a view nor an allocation (:data:`NOT_LAUNCHES`); a custom operator (``torch.library``: the Triton kernels of FlashCUR, of
Nyström's landmarks and of the pseudo-inverse) counts once however many kernels it launches inside. (FlashL1 is
an autograd Function that launches Triton directly, which ``meta`` cannot run: ``l1`` counts its PyTorch path.) ``F.scaled_dot_product_attention`` runs as CUDA runs it with a mask or
in float32 (:class:`CudaAttention`): a boolean mask becomes an additive one (one ``where``), then the
memory-efficient kernel, one launch forward and one backward (on ``meta`` PyTorch would otherwise decompose it
into its math form). Some ATen operators launch two small kernels on a GPU (an out-of-place ``scatter``: a copy,
then the scatter); the count is of operators.

``pinv``: the launches inside the pseudo-inverse (:func:`attention.pinv.iterative_pinv`; its fused kernels,
``lra_pinv::*``, on a GPU where they take the size, its PyTorch form's dozens of small products elsewhere).

Writes ``launches.csv`` (per variant: forward, backward and total launches, those of the pseudo-inverse, and every
operator counted, most frequent first) under ``--out``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra.utils import get_class
from omegaconf import open_dict
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from lra.bench import common
from lra.config import compose_config
from lra.build import build_model

aten = torch.ops.aten
COLUMNS = ["variant", "n", "batch", "heads", "head_dim", "landmarks", "dtype", "status", "reason", "forward", "backward",
           "launches", "pinv", "ops", "torch"]
# Operators that launch no kernel: views and aliases (also those whose schema does not say so) and allocations.
NOT_LAUNCHES = {aten._unsafe_view, aten.detach, aten.alias, aten.lift_fresh, aten.empty, aten.empty_like,
                aten.empty_strided, aten.new_empty, aten.new_empty_strided, aten.scalar_tensor, aten._reshape_alias}
PINV_SOURCES = ("attention/pinv.py", "kernels/pinv/")  # where the pseudo-inverse's code lives (fused and PyTorch forms)


def launches_kernel(func, out) -> bool:
    """Whether the dispatched operator ``func``, which returned ``out``, launches a kernel: it writes a tensor
    (``promote_types`` and its like return none) and is neither a view nor an allocation (:data:`NOT_LAUNCHES`)."""
    writes = isinstance(out, torch.Tensor) or (isinstance(out, (tuple, list)) and any(isinstance(x, torch.Tensor) for x in out))
    return writes and not (func.is_view or func.overloadpacket in NOT_LAUNCHES)


def in_pinv() -> bool:
    """Whether the caller runs inside the pseudo-inverse (a frame of :data:`PINV_SOURCES` on the Python stack: its
    forward, and the backward of its autograd node or custom op)."""
    frame = sys._getframe(2)
    while frame is not None:
        if any(source in frame.f_code.co_filename for source in PINV_SOURCES):
            return True
        frame = frame.f_back
    return False


class LaunchCounter(TorchDispatchMode):
    """Counts the operators dispatched inside the ``with`` block that launch a kernel (module doc), per ``phase``
    (set it to ``"forward"`` / ``"backward"``), each operator's count in :attr:`ops`, and in ``counts["pinv"]``
    those that run inside the pseudo-inverse (:func:`in_pinv`)."""

    def __init__(self):
        super().__init__()
        self.phase = "forward"
        self.counts: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if launches_kernel(func, out):
            self.counts[self.phase] += 1
            self.counts["pinv"] += in_pinv()
            name = func.overloadpacket.__name__
            self.ops[name if func.namespace == "aten" else f"{func.namespace}::{name}"] += 1
        return out


def efficient_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                        enable_gqa=False):
    """``F.scaled_dot_product_attention`` as CUDA computes it with a mask or in float32: a boolean mask turned into
    an additive one (``where``), then ``aten._scaled_dot_product_efficient_attention`` (backward: its backward op)."""
    if enable_gqa:
        raise ValueError("lra.bench launches: scaled_dot_product_attention with enable_gqa is not modelled")
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.where(attn_mask, 0.0, -math.inf).to(query.dtype)
    if attn_mask is not None:
        attn_mask = attn_mask.expand(*query.shape[:-1], key.shape[-2])
    wants_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value))
    return aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, wants_grad, dropout_p, is_causal,
                                                        scale=scale)[0]


class CudaAttention(TorchFunctionMode):
    """Runs ``F.scaled_dot_product_attention`` as :func:`efficient_attention` inside the ``with`` block."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            return efficient_attention(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


class Captured(Exception):
    """Raised by the capture hook: the model's forward stops at its first attention call."""


def attention_call(cfg, batch: int, n: int) -> tuple[torch.nn.Module, tuple, dict]:
    """The first attention module of ``cfg``'s model (an instance of ``cfg.attention._target_``) and the arguments
    the model calls it with, on ``meta``, for ``batch`` sequences of ``n`` tokens."""
    with torch.device("meta"):
        model = build_model(cfg).eval()
    target = get_class(cfg.attention._target_)
    module = next((m for m in model.modules() if isinstance(m, target)), None)
    if module is None:
        raise ValueError(f"no {cfg.attention._target_} module in the model of attention={cfg.attention.name}")
    seen: dict = {}

    def capture(_, args, kwargs):
        seen.update(args=args, kwargs=kwargs)
        raise Captured

    handle = module.register_forward_pre_hook(capture, with_kwargs=True)
    ids = torch.zeros(batch, n, dtype=torch.long, device="meta")
    mask = torch.ones(batch, n, dtype=torch.bool, device="meta")
    try:
        with torch.no_grad():
            model(ids, mask)
    except Captured:
        pass
    finally:
        handle.remove()
    if not seen:
        raise ValueError(f"the model of attention={cfg.attention.name} never called its {cfg.attention._target_}")
    return module, seen["args"], seen["kwargs"]


def fresh(value, dtype: torch.dtype):
    """A floating tensor as a new leaf of the same shape and strides in ``dtype`` that requires grad; others as they are."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        out = torch.empty_strided(value.shape, value.stride(), dtype=dtype, device=value.device)
        return out.requires_grad_()
    return value


def forward_backward(module: torch.nn.Module, args: tuple, kwargs: dict, dtype: torch.dtype, mode):
    """``module(*args, **kwargs)``'s forward and backward (``torch.autograd.grad`` of its output, floating arguments
    as fresh leaves of ``dtype``) inside the dispatch mode ``mode``, whose ``phase`` turns to ``"backward"`` between
    the two, after one warm-up call outside it (what a module caches, it makes once); returns ``mode``."""
    args = tuple(fresh(a, dtype) for a in args)
    kwargs = {key: fresh(value, dtype) for key, value in kwargs.items()}
    leaves = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor) and x.requires_grad]
    leaves += [p for p in module.parameters() if p.requires_grad]

    def step(watched):
        with CudaAttention():
            out = module(*args, **kwargs)
            if watched is not None:
                watched.phase = "backward"
            torch.autograd.grad(out, leaves, torch.empty_like(out), allow_unused=True)

    step(None)
    with mode:
        step(mode)
    return mode


def count(module: torch.nn.Module, args: tuple, kwargs: dict, dtype: torch.dtype) -> LaunchCounter:
    """The launches of ``module(*args, **kwargs)``'s forward and backward (:func:`forward_backward`)."""
    return forward_backward(module, args, kwargs, dtype, LaunchCounter())


def measure(module, args, kwargs, dtype: torch.dtype) -> dict:
    """Forward, backward and total launches, those of the pseudo-inverse, and every operator counted."""
    counter = count(module, args, kwargs, dtype)
    return {"forward": counter.counts["forward"], "backward": counter.counts["backward"],
            "launches": counter.counts["forward"] + counter.counts["backward"], "pinv": counter.counts["pinv"],
            "ops": " ".join(f"{name}:{number}" for name, number in counter.ops.most_common())}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=4096, help="sequence length")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--landmarks", type=int, default=64,
                        help="attention.num_landmarks of the variants that have the key (m)")


def variant_config(variant: common.Variant, args: argparse.Namespace):
    """The composed config of ``variant``: the Text task at ``--n``, one layer of ``--heads`` × ``--head-dim`` (a
    model with its own head count, MEGA's single head, keeps it), ``--landmarks`` where the variant has the key."""
    baseline = compose_config(["task=text", f"task.max_length={args.n}", f"attention={common.BASELINE}"])
    cfg = compose_config(["task=text", f"task.max_length={args.n}", *variant.config_overrides()])
    with open_dict(cfg):
        cfg.model.num_layers = 1
        cfg.model.d_model = args.heads * args.head_dim
        if cfg.model.num_heads == baseline.model.num_heads:
            cfg.model.num_heads = args.heads
        if "num_landmarks" in cfg.attention and not any(item.startswith("num_landmarks=") for item in variant.overrides):
            cfg.attention.num_landmarks = args.landmarks
    return cfg


def run(args: argparse.Namespace) -> list[dict]:
    """One row per variant (counted or skipped); prints the table, writes ``launches.csv``; returns the rows."""
    out = Path(args.out) if args.out else common.default_out_dir()
    dtype = common.DTYPES[args.dtype]
    rows = []
    for variant in common.select_variants(args.variants, args.variant_overrides):
        row = {"variant": variant.label, "n": args.n, "batch": args.batch, "heads": args.heads,
               "head_dim": args.head_dim, "dtype": args.dtype, "torch": torch.__version__}
        cfg = variant_config(variant, args)
        row["landmarks"] = cfg.attention.get("num_landmarks")
        try:
            row.update(status="ok", **measure(*attention_call(cfg, args.batch, args.n), dtype))
        except (RuntimeError, ValueError, NotImplementedError) as error:
            row.update(status="skipped", reason=f"{type(error).__name__}: {str(error).splitlines()[0]}")
        rows.append(row)
        print(f"{variant.label}: {row['status']} {row.get('reason', '')}", flush=True)
    common.write_csv(rows, COLUMNS, out / "launches.csv")
    print(f"\nkernel launches of one attention layer's forward + backward on the CUDA path (counted on meta), "
          f"n = {args.n}, batch {args.batch}, {args.heads} heads × {args.head_dim}, m = {args.landmarks}, {args.dtype}")
    print(common.format_table(rows, [
        ("variant", "variant", str), ("forward", "fwd", str), ("backward", "bwd", str), ("launches", "total", str),
        ("pinv", "of which pinv", str), ("ops", "most frequent", lambda v: " ".join(v.split()[:6])),
        ("reason", "skipped because", lambda v: v[:90]),
    ]))
    print(f"\ncounted with torch {torch.__version__}\nwrote {out / 'launches.csv'}")
    return rows
