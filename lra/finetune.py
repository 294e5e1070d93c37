"""Parameter-efficient fine-tuning wrappers for ``finetune=...`` (``configs/finetune/*.yaml``).

``lra.train`` applies ``instantiate(cfg.finetune)(model)`` after ``init_from`` has loaded a checkpoint, so the
conversion recipe of TPTT §3.4 / §4.1 is ``init_from=<softmax .ckpt> attention=liza finetune=lora``: the
softmax weights load into LiZA's shared projections, LoRA adapters wrap ``q_proj, k_proj, v_proj, out_proj``
and only the adapters (and the modules named in ``trainable``, the head by default) are trained.
"""

from __future__ import annotations

from typing import Sequence

from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn


def apply_lora(
    model: nn.Module,
    r: int = 8,
    alpha: int = 16,
    dropout: float = 0.05,
    target: Sequence[str] = ("q_proj", "k_proj", "v_proj", "out_proj"),
    trainable: Sequence[str] = ("head",),
) -> PeftModel:
    """Wrap ``model`` with LoRA adapters (Hu et al. 2022; TPTT §4.1: r 8, α 16, dropout 0.05) through ``peft``.

    ``ΔW = (α / r) B A`` with ``A`` ``(r, d_in)`` random and ``B`` ``(d_out, r)`` zero, so the wrapped model
    starts equal to ``model``. Every original parameter is frozen except those under a module whose name
    has a component in ``trainable`` (e.g. ``head``; add ``attend`` to also train LiZA's β and gate).
    Returns a ``PeftModel`` with the same ``forward(input_ids, mask) -> (logits, aux_losses)``; frozen
    parameters get no gradient, so AdamW leaves them untouched. :func:`merge_lora` folds the adapters back.
    """
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(target) - names)
    if missing:
        raise ValueError(f"finetune.target names modules the model does not have: {missing} (model modules end in e.g. q_proj, out_proj)")
    unknown = sorted(set(trainable) - names)
    if unknown:
        raise ValueError(f"finetune.trainable names modules the model does not have: {unknown} (e.g. head, attend)")
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target), bias="none")
    wrapped = get_peft_model(model, config)
    for name, parameter in model.named_parameters():
        if set(name.split(".")) & set(trainable):
            parameter.requires_grad_(True)
    return wrapped


def merge_lora(model: PeftModel) -> nn.Module:
    """Fold the adapters into the base weights (``W ← W + (α / r) B A``) and return the plain model."""
    return model.merge_and_unload()
