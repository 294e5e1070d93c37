"""``python -m lra.bench plan``: every kernel one attention layer's forward + backward launches on the CUDA path, with
its grid, its serial loop and the dtype of its sequence-sized operands, computed on a machine without a GPU.

What makes an efficient attention slow on a GPU is rarely its FLOPs: it is a kernel that runs on a tenth of the chip
while it walks the sequence, and float32 data where bf16 would take the tensor cores. Both can be read off the
kernels a step launches. As ``lra.bench launches`` does, the variant's attention module runs forward and backward on
PyTorch's ``meta`` device (what CUDA tensors look like from the host: the CUDA branches of the code), at ``--n`` and
again at ``2n``; each dispatched operator that launches a kernel becomes one line (:class:`Kernel`). The two runs
launch the same operators in the same order; an operator is *n-dependent* when its serial loop grows from the first
run to the second, or its work grows by more than one value per token and head (``B·H·n``): a pass over a mask or a
per-token score is one short wave whatever its grid, a pass over ``n × d`` or ``n × m`` data is not. The Triton kernels inside the custom operators (``lra_flashcur::*``, ``lra_nystrom::*``,
``lra_pinv::*``) are recorded by their own launch code, run on ``meta`` tensors under
:func:`kernels.common.launch.recording` as on sm_90: their grids are the ones a GPU gets.

Grids of ATen's CUDA kernels follow their launch rules, simplified to the fewest programs they may use (rules in
:func:`aten_kernel`); H100/H200: 132 SMs. The rules the efficient variants must keep (:func:`violations`):

1. no n-dependent kernel with fewer than :data:`kernels.common.launch.TWO_WAVES` (264) programs;
2. no attention kernel given 128 or fewer queries or keys;
3. in a bf16 run, no n-dependent tensor in float32 beyond one value per token and head (per-row statistics, as
   flash attention's log-sum-exp).

With ``--predict h100|h200|a100`` each kernel also gets FLOPs, bytes, occupancy and a predicted time, the layer its
eager and one-graph totals against SDPA's (:mod:`lra.bench.roofline`, :mod:`lra.bench.predict`), and a fourth rule:

4. no kernel on fewer programs than the GPU has SMs is predicted above 5 % of SDPA's forward + backward at the shape.

Writes ``plan.csv`` (one row per kernel; ``predict.csv`` with ``--predict``) under ``--out``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch._library import custom_ops
from torch.utils._python_dispatch import TorchDispatchMode

from kernels.common import launch as triton_launch
from kernels.common.launch import SMS, TWO_WAVES
from lra.bench import common, launches, predict, roofline
from lra.bench.roofline import ATTENTION_BACKWARD, GEMMS

aten = torch.ops.aten
CAPABILITY = 90  # the Triton launches are computed as on sm_90 (H100/H200)
SOFTMAXES = {aten._softmax, aten._softmax_backward_data, aten._log_softmax}
REDUCTIONS = {aten.sum, aten.amax, aten.amin, aten.mean, aten.max, aten.min, aten.any, aten.all, aten.linalg_vector_norm,
              aten.prod, aten.var_mean, aten.argmax, aten.argmin, aten.logsumexp}
SORTS = {aten.sort}
SCANS = {aten.cumsum, aten.cumprod}
IN_PLACE_SCATTERS = {aten.scatter_, aten.scatter_add_, aten.index_put_, aten.index_add_, aten.index_copy_}
ATTENTION = {aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_flash_attention,
             aten._scaled_dot_product_cudnn_attention}
PER_TOKEN_SLACK = 1.5  # growth from n to 2n up to 1.5 values per token and head counts as one: chunk padding
COLUMNS = ["variant", "batch", "n", "heads", "head_dim", "landmarks", "dtype", "index", "phase", "kernel", "programs",
           "loop", "trips", "n_dependent", "n_sized_dtypes", "violation"]


@dataclass(frozen=True)
class Kernel:
    """One launch: ``kernel`` name, ``phase`` (forward / backward), ``programs`` (CTAs), the serial ``loop`` each runs
    (what it walks, ``trips`` iterations), ``work`` (the quantity that grows with the sequence: products, elements
    read or written), ``tensors`` ((numel, dtype) of its tensor arguments and results), attention kernels' query and
    key counts (``attention``), and, once compared with the ``2n`` run, ``n_dependent`` and ``n_sized`` (the dtypes
    of its tensors that grow by more than one value per token and head)."""

    kernel: str
    phase: str
    programs: int
    loop: str
    trips: int
    work: int
    tensors: tuple
    attention: tuple[int, int] | None = None
    n_dependent: bool = False
    n_sized: tuple[torch.dtype, ...] = ()
    launch: object = field(default=None, compare=False, repr=False)  # a Triton kernel's PlannedLaunch


def _tensors(values) -> list[torch.Tensor]:
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(_tensors(value))
    return found


def aten_kernel(func, args, kwargs, out, phase: str) -> Kernel:
    """The launch of one ATen operator on CUDA (programs and serial loop by the operator's launch rule):

    * GEMMs (cuBLAS): ``batch · ⌈M/128⌉ · ⌈N/128⌉`` tiles of 128 × 128, each looping over ``K`` in steps of 32;
    * softmax over a row of ``D`` (the last dim): ``D ≤ 1024``, one warp a row, 4 rows a block; longer, one block a row
      looping over ``D`` by 1024;
    * reductions (ATen's Reduce.cuh): 32 outputs a block, the reduced elements split over 16 warps and, when each
      thread would still sum ≥ 256 values and the grid is under 4 blocks per SM, across blocks (global reduction);
    * sort over ``D ≤ 4096``: one block a slice (bitonic / warp-merge sort in shared memory); longer, a segmented radix
      sort spread over all elements (4096 a block); scans: 16 rows a block, looping over the row by 32;
    * attention kernels (memory-efficient / flash): forward one program per 64 queries looping over the keys,
      backward one per 64 keys looping over the queries;
    * every other operator (pointwise, copies, gathers, fills): 512 output elements a block, no loop; an in-place
      scatter, 512 of the elements it writes.
    """
    packet = func.overloadpacket
    inputs, outputs = _tensors(args) + _tensors(list(kwargs.values())), _tensors([out])
    numel_in = max((x.numel() for x in inputs), default=0)
    numel_out = max((x.numel() for x in outputs), default=0)
    tensors = tuple((x.numel(), x.dtype) for x in inputs + outputs)
    name = packet.__name__
    if packet in GEMMS:
        a, b = (args[1], args[2]) if packet in (aten.addmm, aten.baddbmm) else (args[0], args[1])
        batch = a.shape[0] if a.dim() == 3 else 1
        rows, inner, cols = a.shape[-2], a.shape[-1], b.shape[-1]
        programs = batch * math.ceil(rows / 128) * math.ceil(cols / 128)
        return Kernel(name, phase, programs, "K", math.ceil(inner / 32), batch * rows * cols * inner, tensors)
    if packet in SOFTMAXES:
        size = args[0].shape[-1]
        rows = args[0].numel() // max(size, 1)
        if size <= 1024:
            return Kernel(name, phase, math.ceil(rows / 4), "none", 1, numel_in, tensors)
        return Kernel(name, phase, rows, "row", math.ceil(size / 1024), numel_in, tensors)
    if packet in REDUCTIONS:
        outputs_count = max(numel_out, 1)
        reduced = max(numel_in // outputs_count, 1)
        grid = math.ceil(outputs_count / 32)
        per_thread = math.ceil(reduced / 16)
        ctas = 1
        if per_thread >= 256 and grid <= 4 * SMS:
            ctas = max(min(math.ceil(4 * SMS / grid), math.ceil(per_thread / 16)), math.ceil(per_thread / 256))
        return Kernel(name, phase, grid * ctas, "reduced", math.ceil(per_thread / ctas), numel_in, tensors)
    if packet in SORTS:
        size = args[0].shape[-1] if args[0].dim() else 1
        slices = args[0].numel() // max(size, 1)
        if size <= 4096:
            return Kernel(name, phase, slices, "slice", math.ceil(size / 512), numel_in, tensors)
        return Kernel(name, phase, math.ceil(numel_in / 4096), "none", 1, numel_in, tensors)
    if packet in SCANS:
        size = args[0].shape[-1] if args[0].dim() else 1
        rows = args[0].numel() // max(size, 1)
        return Kernel(name, phase, math.ceil(rows / 16), "row", math.ceil(size / 32), numel_in, tensors)
    if packet in ATTENTION or packet in ATTENTION_BACKWARD:
        q, k = (args[1], args[2]) if packet in ATTENTION_BACKWARD else (args[0], args[1])
        batch_heads, queries, keys = q.shape[0] * q.shape[1], q.shape[-2], k.shape[-2]
        work = batch_heads * queries * keys
        if packet in ATTENTION:
            return Kernel(name, phase, batch_heads * math.ceil(queries / 64), "keys", math.ceil(keys / 64), work,
                          tensors, (queries, keys))
        return Kernel(name, phase, batch_heads * math.ceil(keys / 64), "queries", math.ceil(queries / 64), work,
                      tensors, (queries, keys))
    work = numel_out  # a gather reads what it writes; a pointwise operator, every element
    if packet in IN_PLACE_SCATTERS:  # writes the rows its index names, not its whole destination
        work = min(x.numel() for x in inputs[1:])
        return Kernel(name, phase, max(math.ceil(work / 512), 1), "none", 1, work, tensors)
    return Kernel(name, phase, max(math.ceil(numel_out / 512), 1), "none", 1, work, tensors)


class PlanMode(TorchDispatchMode):
    """Records a :class:`Kernel` for every operator dispatched inside the block that launches one
    (:func:`lra.bench.launches.launches_kernel`); a custom operator runs its real implementation on
    the ``meta`` tensors, whose Triton launches :func:`kernels.common.launch.recording` captures."""

    def __init__(self, recorded: list):
        super().__init__()
        self.phase = "forward"
        self.kernels: list[Kernel] = []
        self.recorded = recorded

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace.startswith("lra_"):
            definition = custom_ops.OPDEFS[func._schema.name]
            seen = len(self.recorded)
            with self:
                out = definition._init_fn(*args, **kwargs)
            for launch in self.recorded[seen:]:
                tensors = tuple((math.prod(shape), dtype) for shape, dtype in launch.tensors)
                work = sum(numel for numel, _ in tensors)  # the elements it reads and writes
                self.kernels.append(Kernel(f"{func._schema.name}:{launch.kernel}", self.phase, launch.programs,
                                           launch.loop[0], launch.loop[1], work, tensors, launch=launch))
            del self.recorded[seen:]
            return out
        out = func(*args, **kwargs)
        if launches.launches_kernel(func, out):
            self.kernels.append(aten_kernel(func, args, kwargs, out, self.phase))
        return out


def trace(module: torch.nn.Module, args: tuple, kwargs: dict, dtype: torch.dtype, capability: int = CAPABILITY) -> list[Kernel]:
    """The kernels of ``module(*args, **kwargs)``'s forward and backward (:func:`lra.bench.launches.forward_backward`:
    after one unrecorded warm-up call), Triton's launched as on ``sm_<capability>``."""
    with triton_launch.recording(capability) as recorded:
        return launches.forward_backward(module, args, kwargs, dtype, PlanMode(recorded)).kernels


def compare(kernels: list[Kernel], doubled: list[Kernel], per_token: int) -> list[Kernel]:
    """``kernels`` with ``n_dependent`` (its loop grows, or its work by more than ``per_token``) and ``n_sized`` set
    from the same launches at ``2n`` (``doubled``); ``per_token``: ``B·H·n``, the growth of a tensor holding one value
    per token and head (times :data:`PER_TOKEN_SLACK`: a per-token tensor padded to whole chunks,
    :func:`attention.landmark_stages.chunks`, grows by a little more)."""
    names, doubled_names = [k.kernel for k in kernels], [k.kernel for k in doubled]
    if names != doubled_names:
        raise RuntimeError("lra.bench plan: the layer launches other kernels at 2n than at n; the plan compares "
                           f"launches one to one ({len(names)} vs {len(doubled_names)} kernels)")
    compared = []
    for kernel, twice in zip(kernels, doubled):
        n_sized = tuple(dtype for (numel, dtype), (numel2, _) in zip(kernel.tensors, twice.tensors)
                        if dtype.is_floating_point and numel2 - numel > PER_TOKEN_SLACK * per_token)
        grows = twice.trips > kernel.trips or twice.work - kernel.work > PER_TOKEN_SLACK * per_token
        compared.append(replace(kernel, n_dependent=grows, n_sized=n_sized))
    return compared


def violations(kernel: Kernel, dtype: torch.dtype) -> list[str]:
    """Which of the three rules (module doc) ``kernel`` breaks in a run of ``dtype``."""
    broken = []
    if kernel.n_dependent and kernel.programs < TWO_WAVES:
        broken.append(f"n-dependent on {kernel.programs} programs (< {TWO_WAVES})")
    if kernel.attention is not None and min(kernel.attention) <= 128:
        broken.append(f"attention kernel with {kernel.attention[0]} queries, {kernel.attention[1]} keys (<= 128)")
    if dtype == torch.bfloat16 and any(d in (torch.float32, torch.float64) for d in kernel.n_sized):
        broken.append("float32 n-sized tensor in a bf16 run")
    return broken


def plan_variant(variant: common.Variant, args: argparse.Namespace, batch: int, cfg=None,
                 capability: int = CAPABILITY) -> list[Kernel]:
    """The compared kernels (:func:`compare`) of ``variant``'s attention layer at ``batch`` × ``args.n``; ``cfg``: its
    composed config (:func:`lra.bench.launches.variant_config`) with ``task.max_length ≥ 2n``, composed at ``2n`` if
    not given (one config for both runs: only Linformer reads the length, and slices its projections to ``n``)."""
    dtype = common.DTYPES[args.dtype]
    if cfg is None:
        cfg = launches.variant_config(variant, argparse.Namespace(**{**vars(args), "n": 2 * args.n}))
    runs = [trace(*launches.attention_call(cfg, batch, n), dtype, capability) for n in (args.n, 2 * args.n)]
    return compare(*runs, per_token=batch * args.heads * args.n)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=4096, help="sequence length (the plan compares it with 2n)")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32],
                        help="batch sizes to plan (default: the attention benchmark's 8 and Text training's 32)")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--landmarks", type=int, default=64,
                        help="attention.num_landmarks of the variants that have the key (m)")
    parser.add_argument("--predict", choices=sorted(roofline.GPUS),
                        help="also predict each kernel's time on this GPU and the layer's against SDPA's "
                             "(lra/bench/roofline.py; writes predict.csv)")


def run(args: argparse.Namespace) -> list[dict]:
    """One row per kernel of every variant and batch size; prints each plan and the rules' verdict."""
    out = Path(args.out) if args.out else common.default_out_dir()
    dtype = common.DTYPES[args.dtype]
    gpu = roofline.GPUS[args.predict] if args.predict else None
    rows, predicted = [], []
    variants = common.select_variants(args.variants or ["curformer", "flashcur", "nystromformer"], args.variant_overrides)
    for variant in variants:
        for batch in args.batches:
            head = {"variant": variant.label, "batch": batch, "n": args.n, "heads": args.heads,
                    "head_dim": args.head_dim, "landmarks": args.landmarks, "dtype": args.dtype}
            try:
                kernels = plan_variant(variant, args, batch, capability=gpu.capability if args.predict else CAPABILITY)
            except (RuntimeError, ValueError, NotImplementedError) as error:
                print(f"\n{variant.label}, B {batch}: not planned ({type(error).__name__}: {str(error).splitlines()[0]})")
                continue
            table = []
            for index, kernel in enumerate(kernels):
                broken = violations(kernel, dtype)
                table.append({**head, "index": index, "phase": kernel.phase, "kernel": kernel.kernel,
                              "programs": kernel.programs, "loop": kernel.loop, "trips": kernel.trips,
                              "n_dependent": kernel.n_dependent,
                              "n_sized_dtypes": " ".join(sorted({str(d).removeprefix("torch.") for d in kernel.n_sized})),
                              "violation": "; ".join(broken)})
            rows += table
            broken = [row for row in table if row["violation"]]
            print(f"\n{variant.label}: one layer, B {batch}, H {args.heads}, n {args.n}, d {args.head_dim}, "
                  f"m {args.landmarks}, {args.dtype}: {len(table)} kernels, "
                  f"{'all three rules hold' if not broken else f'{len(broken)} break a rule'}")
            print(common.format_table(table, [
                ("index", "#", str), ("phase", "phase", str), ("kernel", "kernel", str), ("programs", "programs", str),
                ("loop", "loop", str), ("trips", "trips", str), ("n_dependent", "grows with n", lambda v: "yes" if v else ""),
                ("n_sized_dtypes", "n-sized dtypes", str), ("violation", "breaks", str),
            ]))
            if gpu is not None:
                predicted += predict.report(variant, kernels, args, batch, gpu, plan_variant)
    common.write_csv(rows, COLUMNS, out / "plan.csv")
    if gpu is not None:
        common.write_csv(predicted, predict.COLUMNS, out / "predict.csv")
    print(f"\nprograms as launched on a {SMS}-SM GPU (Triton launches computed for sm_{CAPABILITY}); "
          f"counted with torch {torch.__version__}\nwrote {out / 'plan.csv'}")
    return rows
