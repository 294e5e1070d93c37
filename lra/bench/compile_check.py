"""Compiled against eager: a variant's real network trained a step both ways, from the same weights and batches.

:func:`compare` builds the model of a composed config (:func:`lra.build.build_model`) with every dropout
set to 0 (:func:`without_dropout`: compiled code draws its own random numbers, so with dropout on the two
would differ by design), runs a training step (forward, cross-entropy + auxiliary losses as
``lra.module.LRAModule`` sums them, backward) eagerly on batches of two lengths, compiles the same module in
place as ``model.compile=true`` does (:func:`lra.module.compile_in_place`; on CPU the second length recompiles with dynamic
shapes) and runs the steps again. It returns the largest difference of the logits and of the loss, each
relative to that tensor's largest entry (entries that cancel to ~0 have no relative error of their own),
and of the gradients relative to the largest gradient entry of all parameters: some gradients are 0 up to rounding (the key projection's bias:
softmax is unchanged by a shift of every key's score), so their own largest entry is rounding noise and no
scale; the whole gradient's is. Also the number of graphs compiled and the first compiled step's seconds.
``tests/runtime/test_compile.py`` runs it on the CPU, ``python -m lra.bench.gpu_check`` (``compile`` step) on CUDA.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch._dynamo
import torch._inductor.config
import torch.nn.functional as F
from torch._dynamo.utils import counters
from omegaconf import DictConfig, open_dict

from lra.bench import common
from lra.build import build_model
from lra.module import compile_in_place

TOLERANCE = 1e-5  # fp32, relative to each tensor's largest entry (issue #23)


def without_dropout(cfg: DictConfig) -> DictConfig:
    """``cfg`` with every ``dropout`` / ``*_dropout`` number of its ``model`` and ``attention`` nodes set to 0, in place."""

    def zero(node) -> None:
        with open_dict(node):
            for key, value in node.items():
                if isinstance(value, DictConfig):
                    zero(value)
                elif (key == "dropout" or key.endswith("_dropout")) and isinstance(value, (int, float)):
                    node[key] = 0.0

    zero(cfg.model)
    zero(cfg.attention)
    return cfg


def training_step(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                  labels: torch.Tensor, seed: int | None = None) -> dict[str, torch.Tensor]:
    """Logits, loss and each parameter's gradient (``grad/<name>``) of one forward and backward; from ``seed``
    (``torch.manual_seed``) when given, so a variant that draws in its forward (Orthoformer's first landmark) draws
    the same numbers in the eager and the compiled step (:func:`compare` has the compiled code draw with ATen's
    generator)."""
    if seed is not None:
        torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    logits, aux_losses = model(ids, mask)
    loss = F.cross_entropy(logits.float(), labels) + sum(aux_losses.values())
    loss.backward()
    grads = {f"grad/{name}": p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return {"logits": logits.detach().clone(), "loss": loss.detach().clone(), **grads}


def batch_of(cfg: DictConfig, batch: int, n: int, device: torch.device, seed: int) -> tuple[torch.Tensor, ...]:
    """``batch`` random sequences of ``n`` tokens, the second half of the last one padded, and random labels."""
    generator = torch.Generator().manual_seed(seed + n)
    ids = torch.randint(0, cfg.task.vocab_size, (batch, n), generator=generator).to(device)
    labels = torch.randint(0, cfg.task.num_classes, (batch,), generator=generator).to(device)
    mask = torch.ones(batch, n, dtype=torch.bool, device=device)
    mask[-1, n // 2:] = False
    return ids, mask, labels


def compare(cfg: DictConfig, device: torch.device, batch: int = 3, lengths: tuple[int, ...] = (48, 40), seed: int = 0,
            backend: str | Callable = "inductor") -> dict:
    """Eager and compiled (``torch.compile`` ``backend``, as training compiles) training steps of ``cfg``'s
    model, one per length of ``lengths`` (:func:`batch_of`; a second length recompiles with dynamic shapes,
    as training's next batch does): ``{"logits", "loss", "grads"}``, the
    largest relative errors over the lengths (module docstring), ``"worst"``: the gradient with the largest
    difference, ``"tensors"``: how many were compared per length, ``"graphs"``: how many graphs dynamo
    compiled, ``"compile_s"``: the first compiled step's seconds. Raises when a compiled step yields other
    tensors (a missing or extra gradient)."""
    torch.manual_seed(seed)
    model = build_model(without_dropout(cfg)).to(device).train()
    batches = [batch_of(cfg, batch, n, device, seed) for n in lengths]
    eager = [training_step(model, *inputs, seed=seed + i) for i, inputs in enumerate(batches)]
    torch._dynamo.reset()  # a fresh cache: past models' entries would count towards dynamo's recompile limit,
    counters.clear()  # past which it runs the code eagerly without saying so
    compile_in_place(model, device, backend)
    # ATen's generator inside the compiled code on every device (on CPU compile_in_place asks for it anyway; on
    # CUDA Inductor's own generator would give Orthoformer's first landmark other draws than the eager step's)
    with torch._inductor.config.patch(fallback_random=True):
        started = time.perf_counter()
        compiled = [training_step(model, *batches[0], seed=seed)]
        common.synchronize(device)
        compile_s = time.perf_counter() - started
        compiled += [training_step(model, *inputs, seed=seed + i) for i, inputs in enumerate(batches) if i > 0]
    result = {"logits": 0.0, "loss": 0.0, "grads": 0.0, "worst": None, "tensors": len(eager[0]),
              "graphs": counters["stats"]["unique_graphs"], "compile_s": compile_s}
    for want, got in zip(eager, compiled):
        if got.keys() != want.keys():
            raise AssertionError(f"the compiled step gave other tensors: {sorted(got.keys() ^ want.keys())}")
        for name in ("logits", "loss"):
            result[name] = max(result[name], common.relative_error(got[name], want[name]))
        names = [name for name in want if name.startswith("grad/")]
        gaps = {name: (got[name] - want[name]).abs().max().item() for name in names}
        worst = max(gaps, key=gaps.get)
        error = gaps[worst] / max(want[name].abs().max().item() for name in names)
        if result["worst"] is None or error > result["grads"]:
            result["grads"], result["worst"] = error, worst
    return result
