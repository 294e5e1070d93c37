"""One ``lra.bench train`` measurement in a fresh process: ``python -m lra.bench.train_worker SPEC.json``.

``SPEC`` holds ``overrides`` (Hydra, selecting task, length and attention), ``n``, ``batch``,
``steps``, ``warmup``, ``device``, ``dtype``, ``threads`` and ``result`` (where the JSON result goes). The
process sets up as ``lra.train`` does (on CUDA: TF32 float32 products, :func:`lra.runtime.gpu_setup.fast_float32_matmuls`),
builds the real model (``lra.build.build_model``) and AdamW (``cfg.optimizer``, fused on CUDA as training builds
it: :func:`lra.module.optimizers_per_step`), then:

1. the FLOPs of one training step (forward and backward, eager: :func:`lra.bench.counters.count_flops`);
   with ``model.compile=true`` in the overrides the model is compiled after this
   (:func:`lra.module.compile_in_place`, as ``lra.module.LRAModule.configure_model`` does);
2. one untimed training step under :class:`lra.bench.counters.SavedTensorBytes` (parameters excluded), its
   wall time ``first_step_s`` (compilation included when compiled);
3. ``warmup`` untimed steps, then ``steps`` timed steps (forward, cross-entropy + auxiliary
   losses as ``lra.module.LRAModule`` sums them, backward, ``optimizer.step()``), median step time and the
   FLOP/s it reaches (``train_flops / train_step_s``);
4. inference: eval mode, ``torch.inference_mode``, ``warmup`` (at least 1 when compiled: eval mode compiles
   anew) then ``steps`` timed forwards.

Memory: ``state_bytes`` = parameters + gradients + optimizer state; on CUDA ``peak_mem_bytes`` is
``max_memory_allocated`` over the warm-up and timed steps (:func:`timed_steps`: the peak is reset after the first
step, so compilation's own allocations stay out), on CPU it is ``saved_bytes + state_bytes``;
``rss_peak_bytes`` is the process's peak resident set (``VmHWM``), ``rss_delta_bytes`` that peak
minus the resident set after imports. A fresh process per (variant, n) keeps allocator caches of
one measurement out of the next.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torch import nn

from lra.bench import common, counters
from lra.config import compose_config
from lra.runtime.gpu_setup import fast_float32_matmuls
from lra.build import build_model, compile_setting
from lra.module import compile_in_place, optimizers_per_step


def proc_status(key: str) -> int | None:
    """``/proc/self/status`` field in bytes (Linux), None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_peak_rss() -> None:
    """Set ``VmHWM`` to the current resident set (Linux ``clear_refs`` 5); harmless where unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def documents_shape(model: nn.Module) -> tuple[int, ...]:
    """Leading shape of one example's ids: ``()`` for a single-document head, ``(2,)`` for a pair head
    (Retrieval's ``PairHead`` rejects single-document features with a ValueError)."""
    d_model, device = model.token_embedding.embedding_dim, model.token_embedding.weight.device
    try:
        model.head(torch.zeros(1, d_model, device=device))
        return ()
    except ValueError:
        model.head(torch.zeros(1, 2, d_model, device=device))
        return (2,)


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)


def timed_steps(train_step, device: torch.device, warmup: int, steps: int) -> tuple[float, int | None]:
    """Median seconds of ``steps`` timed ``train_step()`` calls after ``warmup`` untimed ones, and on CUDA the peak
    memory allocated over all of them (None elsewhere).

    The peak is reset before the warm-up, not after it: a compiled model (``mode="reduce-overhead"``) records its
    CUDA graphs in the steps after the compiling one, its activations allocated then from the graphs' pool, and
    a replay allocates nothing, so a peak taken over replays only is the parameters' and AdamW's memory (every
    compiled row read 6.6 MiB on the H200 at 380b043, when the reset came after the warm-up). Eager steps allocate
    the same each step: the window changes nothing for them."""
    if device.type == "cuda":
        common.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    step_s = common.median_seconds(train_step, device, warmup, steps)
    return step_s, int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def measure(spec: dict) -> dict:
    device = torch.device(spec["device"])
    common.setup_process(spec["threads"])
    fast_float32_matmuls(device.type)
    rss_start = proc_status("VmRSS")
    reset_peak_rss()
    cfg = compose_config(spec["overrides"])
    model = build_model(cfg).to(device).train()
    optimizer = optimizers_per_step(instantiate(cfg.optimizer), None, model.parameters())["optimizer"]
    shape = (spec["batch"], *documents_shape(model), spec["n"])
    ids = torch.randint(0, cfg.task.vocab_size, shape, device=device)
    mask = torch.ones(shape, dtype=torch.bool, device=device)
    labels = torch.randint(0, cfg.task.num_classes, (spec["batch"],), device=device)
    params = list(model.parameters())

    def loss_of_batch() -> torch.Tensor:
        with common.autocast(device, spec["dtype"]):
            logits, aux_losses = model(ids, mask)
            return F.cross_entropy(logits.float(), labels) + sum(aux_losses.values())

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_of_batch().backward()
        optimizer.step()

    flops = counters.count_flops(lambda: loss_of_batch().backward())
    optimizer.zero_grad(set_to_none=True)
    compiled = compile_setting(cfg)
    if compiled:
        compile_in_place(model, device)
    started = time.perf_counter()
    with counters.SavedTensorBytes(exclude=params) as saved:
        loss = loss_of_batch()
    loss.backward()
    optimizer.step()
    common.synchronize(device)
    first_step_s = time.perf_counter() - started
    del loss
    step_s, cuda_peak = timed_steps(train_step, device, spec["warmup"], spec["steps"])
    state = state_bytes(model, optimizer)
    model.eval()

    def infer() -> None:
        with torch.inference_mode(), common.autocast(device, spec["dtype"]):
            model(ids, mask)

    infer_s = common.median_seconds(infer, device, max(spec["warmup"], int(compiled)), spec["steps"])
    rss_peak = proc_status("VmHWM")
    return {
        "compiled": compiled,
        "first_step_s": first_step_s,
        "train_step_s": step_s,
        "train_samples_per_s": spec["batch"] / step_s,
        "train_flops": flops,
        "train_flops_per_s": flops / step_s,
        "infer_samples_per_s": spec["batch"] / infer_s,
        "saved_bytes": saved.bytes,
        "state_bytes": state,
        "peak_mem_bytes": cuda_peak if cuda_peak is not None else saved.bytes + state,
        "rss_peak_bytes": rss_peak,
        "rss_delta_bytes": rss_peak - rss_start if rss_peak is not None and rss_start is not None else None,
        "params": sum(p.numel() for p in params),
        "layers": len(model.blocks),
    }


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    result = measure(spec)
    Path(spec["result"]).write_text(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m lra.bench.train_worker SPEC.json (written by python -m lra.bench train)")
    main(sys.argv[1])
