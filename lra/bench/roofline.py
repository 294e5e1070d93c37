"""The time model of ``python -m lra.bench plan --predict h100|h200|a100``: each planned kernel's FLOPs, bytes,
occupancy and predicted time on a named GPU, and a layer's total eager and as one CUDA graph.

Per kernel (:func:`predict`), with ``P`` programs, ``k`` programs per SM (occupancy: :func:`occupancy` from the AOT
compile of our Triton kernels, :data:`ATEN_OCCUPANCY` for ATen's), ``waves = ⌈P / (SMs · k)⌉``::

    t = FLOOR + waves · max(FLOPs_wave / (peak_unit · EFFICIENCY · active · hidden), bytes_wave / (HBM · MEMORY_EFFICIENCY · drawn))

(``FLOPs_wave``, ``bytes_wave``: what ``min(P, SMs · k)`` programs do; a last wave, however empty, takes a full one's time.)

``peak_unit`` (:data:`UNIT_PEAK`): the tensor cores' in bf16, in TF32 for float32 dots that ask for it and a third of
that for 3xTF32 dots (three TF32 products each), the FMA units' for float32 (IEEE ``tl.dot``, float32 cuBLAS without
TF32, softmaxes, reductions, pointwise). ``active``: the share of SMs a wave
occupies (``min(P, SMs) / SMs``); ``hidden = min(1, resident warps per SM / LATENCY_WARPS)``: an SM with few warps
cannot hide its latencies; ``drawn = min(1, SM_BANDWIDTH_SHARE · active)``: a few SMs cannot draw the whole HBM
bandwidth. Bytes: every tensor argument read or written once. A Triton kernel that spills registers (its AOT
compile's stack frame) computes :data:`SPILL_SLOWDOWN` times slower (fit to the pseudo-inverse's measured cost).

Attention kernels (SDPA's flash / memory-efficient kernels) run at a calibrated rate of score elements
(``GPU.attention_rate``: their time grows with ``B·H·n²`` and barely with ``d``, bound by the softmax's per-element
work, not the products), the backward :data:`ATTENTION_BACKWARD_COST` times the forward's per element.

A layer: eager ``max(HOST_PER_CALL + HOST_PER_LAUNCH · launches, Σ t)`` (the host queues launches while the GPU runs
them), as one CUDA graph ``GRAPH_LAUNCH + Σ t``. Constants, their sources and the calibration against the H200 run at
380b043: docs/bench.md, "plan --predict".
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

aten = torch.ops.aten
GEMMS = {aten.mm, aten.bmm, aten.addmm, aten.baddbmm}
ATTENTION_BACKWARD = {aten._scaled_dot_product_efficient_attention_backward,
                      aten._scaled_dot_product_flash_attention_backward,
                      aten._scaled_dot_product_cudnn_attention_backward}


@dataclass(frozen=True)
class Gpu:
    """Datasheet figures of one GPU (docs/bench.md, "plan --predict"); peaks dense, FLOP/s; bandwidth B/s."""

    name: str
    capability: int
    sms: int
    clock_ghz: float
    hbm: float
    bf16: float
    tf32: float
    fp32: float
    shared_per_sm: int
    attention_rate: float  # score elements a second of SDPA's forward (calibrated on the H200 at 380b043)


_H200_RATE = 1.10e12  # 3.5 · B·H·n² / 13.69 ms at B 8, H 2, n 16384 (docs/bench.md, H200 at 380b043)
GPUS = {
    "h100": Gpu("NVIDIA H100 SXM5", 90, 132, 1.98, 3.35e12, 989.4e12, 494.7e12, 66.9e12, 233_472, _H200_RATE),
    "h200": Gpu("NVIDIA H200 SXM", 90, 132, 1.98, 4.8e12, 989.4e12, 494.7e12, 66.9e12, 233_472, _H200_RATE),
    # the calibrated rate scaled by SMs × clock
    "a100": Gpu("NVIDIA A100 SXM4 80GB", 80, 108, 1.41, 2.039e12, 312e12, 156e12, 19.5e12, 167_936,
                _H200_RATE * 108 * 1.41 / (132 * 1.98)),
}
EFFICIENCY = 0.7  # share of a unit's peak a well-shaped kernel reaches (assumed, not measured here)
MEMORY_EFFICIENCY = 0.8  # share of the HBM bandwidth a streaming kernel reaches (assumed)
LATENCY_WARPS = 16  # resident warps an SM needs to keep its units busy (assumed: a quarter of sm_80/sm_90's 64)
SM_BANDWIDTH_SHARE = 4  # an SM draws at most 4 × its even share of the HBM bandwidth (assumed)
FLOOR = 2.5e-6  # s: on-device cost of any kernel (launch, ramp, tail; assumed from typical back-to-back launches)
HOST_PER_LAUNCH = 7e-6  # s: host time of one eager launch (issue #61: 92 launches ≈ 0.55–0.7 ms)
HOST_PER_CALL = 0.79e-3  # s: the rest of one eager forward + backward call (fit: SDPA at n 1024 on the H200)
GRAPH_LAUNCH = 10e-6  # s: replaying one CUDA graph (assumed)
# compute of a Triton kernel that spills registers (AOT stack frame > 0) takes this much longer. Fit, one number: the
# fused pseudo-inverse (unchanged since 380b043; 16 programs, IEEE float32 dots, 255 registers, spills) as the excess of
# CUR over SDPA at n 1024 on the H200 (4.22 − 0.82 ms) against its unslowed model (0.27 ms): docs/bench.md
SPILL_SLOWDOWN = 12.5
ATTENTION_BACKWARD_COST = 2.5  # flash backward / forward per score element (five products against two)
# ATen kernels: (programs per SM, warps per program), assumed: cuBLAS 128 × 128 tiles (8 warps, most of the shared
# memory), flash attention (4 warps, 2 per SM), every other kernel (4 warps, 8 per SM)
ATEN_OCCUPANCY = {"gemm": (1, 8), "attention": (2, 4), "other": (8, 4)}
REGISTERS_PER_SM, THREADS_PER_SM, BLOCKS_PER_SM = 65_536, 2_048, 32


@dataclass(frozen=True)
class Prediction:
    """One kernel's model: ``flops``, ``bytes`` moved, ``unit`` (tensor / fp32 / attention), ``per_sm`` programs,
    ``occupancy`` (where it comes from), ``waves``, ``seconds`` and what bounds it (``bound``)."""

    flops: float
    bytes: float
    unit: str
    per_sm: int
    occupancy: str
    waves: int
    seconds: float
    bound: str


@functools.lru_cache(maxsize=None)
def _compiled(fn, config, pointers: tuple, floats: tuple, capability: int):
    from kernels.common import aot

    return aot.compile_jit(fn, capability, config, dict(pointers), floats)


def occupancy(launch, gpu: Gpu) -> tuple[int, int, str, int]:
    """``(programs per SM, warps per program, source, bytes spilled per thread)`` of a recorded Triton launch
    (:class:`kernels.common.launch.PlannedLaunch`): its AOT compile for the GPU's architecture (registers per thread,
    shared memory per program), limited by the SM's registers, shared memory, threads and blocks."""
    compiled = _compiled(launch.fn, launch.config, tuple(sorted(launch.pointers.items())), launch.floats, gpu.capability)
    warps = launch.config.num_warps
    threads = 32 * warps
    by_registers = REGISTERS_PER_SM // max(compiled.registers * threads, 1)
    by_shared = gpu.shared_per_sm // compiled.shared if compiled.shared else BLOCKS_PER_SM
    per_sm = max(1, min(by_registers, by_shared, THREADS_PER_SM // threads, BLOCKS_PER_SM))
    spills = f", {compiled.stack} B spilled" if compiled.stack else ""
    return per_sm, warps, f"AOT sm_{gpu.capability}: {compiled.registers} regs, {compiled.shared:,} B shared{spills}", compiled.stack


def _roofline(flops, bytes_, peak, programs, per_sm, warps, gpu: Gpu, slowdown: float = 1.0) -> tuple[float, int, str]:
    capacity = gpu.sms * per_sm
    waves = max(1, math.ceil(programs / capacity))
    wave_programs = min(programs, capacity)
    active_sms = min(wave_programs, gpu.sms)
    active = active_sms / gpu.sms
    hidden = min(1.0, warps * math.ceil(wave_programs / active_sms) / LATENCY_WARPS)
    share = wave_programs / programs  # of the work a full wave does: the last wave takes as long however full
    compute = slowdown * flops * share / (peak * EFFICIENCY * active * hidden) if flops else 0.0
    memory = bytes_ * share / (gpu.hbm * MEMORY_EFFICIENCY * min(1.0, SM_BANDWIDTH_SHARE * active))
    bound = "compute" if compute >= memory else "memory"
    return FLOOR + waves * max(compute, memory), waves, bound


def _bytes(tensors) -> float:
    return float(sum(numel * dtype.itemsize for numel, dtype in tensors))


# FLOPs of our Triton kernels in units of B·H·n·m·d (the products each program forms; docs/flashcur.md)
FLASHCUR_FLOPS = {"_rv_fwd": 4, "_out_fwd": 4, "_rv_bwd_kv": 8, "_rv_bwd_q": 6, "_out_bwd_q": 6, "_out_bwd_kw": 8}
# BLOCK³ products per Newton–Schulz step (kernels/pinv/): the forward's four; the backward's three recomputing the
# step's terms (one program per problem and step), seven on the serial chain, one summing ∂A
PINV_PRODUCTS = {"_pinv_fwd": 4, "_pinv_bwd_terms": 3, "_pinv_bwd_steps": 7, "_pinv_bwd_grad": 1}
# the peak a dot's unit reaches: "tensor" (bf16/fp16 operands), TF32, 3xTF32 (three TF32 products per product), "fp32"
# (IEEE float32 dots on the FMA units, and everything that is not a product)
UNIT_PEAK = {"tensor": lambda gpu: gpu.bf16, "tf32": lambda gpu: gpu.tf32, "tf32x3": lambda gpu: gpu.tf32 / 3,
             "fp32": lambda gpu: gpu.fp32}


def kernel_name(planned: str) -> str:
    """The CUDA kernel name of a planned launch: the Triton function after the op's name (``op:function``)."""
    return planned.split(":")[-1]


def triton_flops(kernel, shape) -> tuple[float, str]:
    """``(FLOPs, unit)`` of a recorded Triton launch for ``shape = (B, H, n, m, d)`` (``unit``: a key of
    :data:`UNIT_PEAK`)."""
    batch, heads, n, m, d = shape
    name, launch = kernel_name(kernel.kernel), kernel.launch
    constexprs = launch.config.constexprs if launch is not None and launch.config is not None else {}
    if name in PINV_PRODUCTS:  # float32 dots in the kernels' PRECISION (kernels/pinv/forward.py)
        from kernels.pinv import forward

        block = constexprs.get("BLOCK", m)
        precision = forward.PRECISION.value
        unit = {"ieee": "fp32", "tf32": "tf32", "tf32x3": "tf32x3"}[precision]
        return 2 * block ** 3 * PINV_PRODUCTS[name] * kernel.trips * kernel.programs, unit
    if constexprs.get("F32_DOT", True):  # float32 operands: TF32 tensor-core dots if asked, else the FMA units
        unit = "tf32" if constexprs.get("PRECISION") == "tf32" else "fp32"
    else:
        unit = "tensor"
    if name in FLASHCUR_FLOPS:
        return FLASHCUR_FLOPS[name] * batch * heads * n * m * d, unit
    if name == "_u_fwd":
        return 4 * batch * heads * m * m * d, unit
    return 0.0, "fp32"  # segment means and the like: bytes only


def predict(kernel, shape, gpu: Gpu, aot: bool = True) -> Prediction:
    """The model (module doc) of one :class:`lra.bench.plan.Kernel` at ``shape = (B, H, n, m, d)`` on ``gpu``."""
    bytes_ = _bytes(kernel.tensors)
    packet = getattr(torch.ops.aten, kernel.kernel, None)
    packet = packet if isinstance(packet, torch._ops.OpOverloadPacket) else None
    if kernel.attention is not None:
        elements = kernel.work  # B·H·queries·keys
        cost = ATTENTION_BACKWARD_COST if packet in ATTENTION_BACKWARD else 1.0
        d = kernel.tensors[0][0] * kernel.attention[1] // max(elements, 1)
        flops = (10 if packet in ATTENTION_BACKWARD else 4) * elements * d
        seconds = FLOOR + max(cost * elements / gpu.attention_rate, bytes_ / (gpu.hbm * MEMORY_EFFICIENCY))
        per_sm, _ = ATEN_OCCUPANCY["attention"]
        waves = math.ceil(kernel.programs / (gpu.sms * per_sm))
        return Prediction(flops, bytes_, "attention", per_sm, "assumed (flash attention)", waves, seconds, "elements")
    if kernel.launch is not None:
        flops, unit = triton_flops(kernel, shape)
        per_sm, warps, source, spilled = occupancy(kernel.launch, gpu) if aot else (
            1, kernel.launch.config.num_warps, "not compiled: 1 a SM", 0)
    elif packet in GEMMS:
        flops = 2.0 * kernel.work
        unit = "tensor" if all(dtype in (torch.bfloat16, torch.float16) for _, dtype in kernel.tensors[:2]) else "fp32"
        per_sm, warps = ATEN_OCCUPANCY["gemm"]
        source = "assumed (cuBLAS 128 × 128 tiles)"
    else:
        flops, unit = float(kernel.work), "fp32"
        per_sm, warps = ATEN_OCCUPANCY["other"]
        source = "assumed (ATen, 128 threads a block)"
    peak = UNIT_PEAK[unit](gpu)
    slowdown = SPILL_SLOWDOWN if kernel.launch is not None and spilled else 1.0
    seconds, waves, bound = _roofline(flops, bytes_, peak, kernel.programs, per_sm, warps, gpu, slowdown)
    return Prediction(flops, bytes_, unit, per_sm, source, waves, seconds, bound)


def layer_times(predictions: list[Prediction]) -> dict[str, float]:
    """``device`` (Σ t), ``eager`` and ``graph`` seconds of one layer's forward + backward (module doc)."""
    device = sum(p.seconds for p in predictions)
    host = HOST_PER_CALL + HOST_PER_LAUNCH * len(predictions)
    return {"device": device, "eager": max(host, device), "graph": GRAPH_LAUNCH + device}


def slow_small_grid(kernel, prediction: Prediction, gpu: Gpu, sdpa_device: float) -> str | None:
    """Rule 4: a kernel on fewer programs than the GPU has SMs predicted above 5 % of SDPA's forward + backward
    (device time, at the same shape, by the same model)."""
    if kernel.programs < gpu.sms and prediction.seconds > 0.05 * sdpa_device:
        return (f"{kernel.programs} programs (< {gpu.sms} SMs) predicted {prediction.seconds * 1e3:.3f} ms "
                f"> 5 % of SDPA's {sdpa_device * 1e3:.3f} ms")
    return None
