"""What ``python -m lra.bench attention`` runs for one row: a callable and its inputs at length n.

Two levels, chosen per variant without naming any:

* ``core`` — a drop-in variant (its config leaves ``cfg.model`` as the softmax baseline composes
  it): the attention module of ``lra.build.build_attention`` called as ``attn(q, k, v, key_mask)``
  on ``(B, H, n, head_dim)`` tensors of the run's dtype (``--dtype bf16``: bf16 ``q, k, v``, as the bf16 model's
  projections under autocast hand them to attention; fp32: float32). This isolates the attention computation, as
  the CUR paper's Fig. 4 benchmark does.
* ``layer`` — a variant that swaps the model (Proxyformer's ``[P; X]`` prefix and injection, MEGA's
  EMA + gated block): the real model of ``lra.build.build_model`` with one layer, called as
  ``model.encode(ids, mask, aux_losses)`` (embedding -> block -> mean pooling), so the block gets
  its inputs exactly as in training. Its ratios are taken against softmax at the same level.

References: the configs ``softmax`` (SDPA) and ``softmax_materialised`` (``softmax(QKᵀ/√d + mask) V`` with the n×n
matrix stored), always selected (:func:`lra.bench.common.select_variants`), and on CUDA ``sdpa_flash`` = SDPA
forced to its flash backend (bf16, no mask).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf, open_dict
from torch import nn

from lra.build import build_attention
from lra.bench.common import BASELINE, Variant
from lra.config import compose_config
from lra.build import build_model

FLASH = "sdpa_flash"


@dataclass
class Case:
    """One benchmarked callable: ``forward(*inputs) -> (output, aux_loss or None)``; ``module`` owns its parameters."""

    label: str
    level: str
    make_inputs: Callable[[int], tuple]
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
    module: nn.Module | None = None
    heads: int | None = None


def flash_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """SDPA's flash backend (bf16; it takes no mask, which full-length inputs do not need)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    return out.to(q.dtype)


def qkv_inputs(batch: int, heads: int, head_dim: int, device: torch.device,
               dtype: torch.dtype = torch.float32) -> Callable[[int], tuple]:
    """``q, k, v`` ``(batch, heads, n, head_dim)`` leaves of ``dtype`` (requiring grad) and a full key mask."""

    def make(n: int) -> tuple:
        q, k, v = (torch.randn(batch, heads, n, head_dim, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        return q, k, v, torch.ones(batch, n, dtype=torch.bool, device=device)

    return make


def id_inputs(batch: int, vocab_size: int, device: torch.device) -> Callable[[int], tuple]:
    def make(n: int) -> tuple:
        ids = torch.randint(0, vocab_size, (batch, n), device=device)
        return ids, torch.ones(batch, n, dtype=torch.bool, device=device)

    return make


def core_case(variant: Variant, cfg: DictConfig, batch: int, heads: int, head_dim: int, device,
              dtype: torch.dtype = torch.float32) -> Case:
    node = OmegaConf.create(OmegaConf.to_container(cfg.attention, resolve=True))
    module = build_attention(node, heads, head_dim).to(device).eval()
    return Case(variant.label, "core", qkv_inputs(batch, heads, head_dim, device, dtype),
                lambda q, k, v, mask: (module(q, k, v, mask), None), module, heads)


def layer_case(variant: Variant, cfg: DictConfig, baseline: DictConfig, batch: int, heads: int, head_dim: int,
               device) -> Case:
    """One-layer model of ``cfg``; ``model.num_heads`` follows ``--heads`` unless the variant's model fixes
    a head count of its own (MEGA's single head)."""
    with open_dict(cfg):
        cfg.model.num_layers = 1
        cfg.model.d_model = heads * head_dim
        if cfg.model.num_heads == baseline.model.num_heads:
            cfg.model.num_heads = heads
    model = build_model(cfg).to(device).eval()

    def forward(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        aux: dict[str, torch.Tensor] = {}
        out = model.encode(ids, mask, aux)
        return out, (sum(aux.values()) if aux else None)

    return Case(variant.label, "layer", id_inputs(batch, cfg.task.vocab_size, device), forward, model,
                int(cfg.model.num_heads))


def build_cases(variants: list[Variant], level: str, max_n: int, batch: int, heads: int, head_dim: int,
                device: torch.device, dtype: torch.dtype = torch.float32) -> tuple[list[Case], list[dict]]:
    """Cases for ``variants`` (+ references and the layer-level baseline when needed) and skipped rows; core
    cases get ``q, k, v`` of ``dtype`` (the run's: bf16 under ``--dtype bf16``).

    ``level`` is ``auto`` (core for drop-ins, layer otherwise) or ``layer`` (every variant as a layer).
    A variant that cannot be built here (e.g. FlashCUR without CUDA) becomes a skipped row with the reason.
    """
    task = ["task=text", f"task.max_length={max_n}"]
    baseline = compose_config([*task, f"attention={BASELINE}"])
    cases: list[Case] = []
    skipped: list[dict] = []
    layer_needed = False
    for variant in variants:
        cfg = compose_config([*task, *variant.config_overrides()])
        as_layer = level == "layer" or cfg.model != baseline.model
        layer_needed |= as_layer and variant.name != BASELINE
        try:
            if as_layer:
                cases.append(layer_case(variant, cfg, baseline, batch, heads, head_dim, device))
            else:
                cases.append(core_case(variant, cfg, batch, heads, head_dim, device, dtype))
        except (RuntimeError, ValueError) as error:
            skipped.append({"variant": variant.label, "level": "layer" if as_layer else "core", "status": "skipped",
                            "reason": str(error).splitlines()[0]})
    if level == "auto":
        if layer_needed:
            cases.insert(1, layer_case(Variant(BASELINE), copy.deepcopy(baseline), baseline, batch, heads, head_dim, device))
        make = qkv_inputs(batch, heads, head_dim, device, dtype)
        if device.type == "cuda":
            cases.append(Case(FLASH, "core", make, lambda q, k, v, mask: (flash_sdpa(q, k, v, mask), None), heads=heads))
        else:
            skipped.append({"variant": FLASH, "level": "core", "status": "skipped",
                            "reason": "SDPA's flash backend needs a CUDA device"})
    return cases, skipped
