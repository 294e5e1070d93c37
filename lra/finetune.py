"""Parameter-efficient fine-tuning wrappers for ``finetune=...`` (``configs/finetune/*.yaml``).

``lra.train`` applies ``instantiate(cfg.finetune)(model)`` after ``init_from`` has loaded a checkpoint, so the
conversion recipe of TPTT §3.4 / §4.1 is ``init_from=<softmax .ckpt> attention=liza finetune=lora``: the
softmax weights load into LiZA's shared projections, LoRA adapters wrap ``q_proj, k_proj, v_proj, out_proj``
and only the adapters, the modules named in ``trainable`` (the head by default) and the parameters named in
``trainable_if_present`` (by default LiZA's own new ones: the delta rule's β projection ``beta_weight``,
``beta_bias`` and the learned gate ``gate_logit``, which no softmax checkpoint holds) are trained.
"""

from __future__ import annotations

from typing import Sequence

from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn

LIZA_PARAMETERS = ("beta_weight", "beta_bias", "gate_logit")  # attention.linear.DeltaRuleAttention, attention.liza


def apply_lora(
    model: nn.Module,
    r: int = 8,
    alpha: int = 16,
    dropout: float = 0.05,
    target: Sequence[str] = ("q_proj", "k_proj", "v_proj", "out_proj"),
    trainable: Sequence[str] = ("head",),
    trainable_if_present: Sequence[str] = LIZA_PARAMETERS,
) -> PeftModel:
    """Wrap ``model`` with LoRA adapters (Hu et al. 2022; TPTT §4.1: r 8, α 16, dropout 0.05) through ``peft``.

    ``ΔW = (α / r) B A`` with ``A`` ``(r, d_in)`` random and ``B`` ``(d_out, r)`` zero, so the wrapped model
    starts equal to ``model``. Every original parameter is frozen except those whose dotted name has a
    component in ``trainable`` (module or parameter names that must exist, e.g. ``head``) or in
    ``trainable_if_present`` (trained where the model has them, ignored where it does not: LiZA's β and
    gate by default, so the same config fits a LiZA model and a softmax one). Returns a ``PeftModel`` with
    the same ``forward(input_ids, mask) -> (logits, aux_losses)``; frozen parameters get no gradient, so
    AdamW leaves them untouched. :func:`merge_lora` folds the adapters back.
    """
    modules = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(target) - modules)
    if missing:
        raise ValueError(f"finetune.target names modules the model does not have: {missing} (model modules end in e.g. q_proj, out_proj)")
    parameters = {name.rsplit(".", 1)[-1] for name, _ in model.named_parameters()}
    unknown = sorted(set(trainable) - modules - parameters)
    if unknown:
        raise ValueError(
            f"finetune.trainable names modules or parameters the model does not have: {unknown} (e.g. head, attend); "
            "list names that only some variants have under finetune.trainable_if_present"
        )
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target), bias="none")
    wrapped = get_peft_model(model, config)
    train = set(trainable) | set(trainable_if_present)
    for name, parameter in model.named_parameters():
        if set(name.split(".")) & train:
            parameter.requires_grad_(True)
    return wrapped


def merge_lora(model: PeftModel) -> nn.Module:
    """Fold the adapters into the base weights (``W ← W + (α / r) B A``) and return the plain model."""
    return model.merge_and_unload()
