"""LoRA conversion (TPTT §3.4 / §4.1): only adapters, the head and LiZA's own new parameters train; merged
weights evaluate the same."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from hydra.utils import instantiate

from omegaconf import OmegaConf

from tests.conftest import CONFIG_DIR, compose_config, run_in_process
from lra.finetune import apply_lora, merge_lora
from lra.build import build_model, build_module

SINGLE_THREAD = {"OMP_NUM_THREADS": "1"}


def lora_override() -> str:
    """``finetune=lora`` once ``configs/train.yaml`` lists the finetune group in its defaults, else ``+finetune=lora``."""
    defaults = OmegaConf.to_container(OmegaConf.load(f"{CONFIG_DIR}/train.yaml").defaults)
    listed = any("finetune" in key for entry in defaults if isinstance(entry, dict) for key in entry)
    return "finetune=lora" if listed else "+finetune=lora"


LIZA_OWN = ("beta_weight", "beta_bias", "gate_logit")  # DeltaRuleAttention's β projection, LiZA's learned gate


def is_trainable(name: str) -> bool:
    return "lora_" in name or ".head." in name or name.rsplit(".", 1)[-1] in LIZA_OWN


def fit(module, cfg, steps: int) -> None:
    """``steps`` real optimiser steps of Lightning on the configured tiny data (the module's own AdamW + schedule)."""
    trainer = L.Trainer(max_steps=steps, limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(module, datamodule=instantiate(cfg.task.datamodule))


def test_training_step_changes_only_adapters_head_and_liza_parameters(tiny_listops_overrides, tmp_path):
    cfg = compose_config([*tiny_listops_overrides, "attention=liza", "attention/linear=delta", lora_override()], tmp_path)
    L.seed_everything(0)
    module = build_module(cfg)
    module.model = instantiate(cfg.finetune)(module.model)
    before = {name: p.detach().clone() for name, p in module.model.named_parameters()}
    fit(module, cfg, steps=2)
    after = dict(module.model.named_parameters())
    changed = {name for name, p in after.items() if not torch.equal(p, before[name])}
    assert changed == {name for name in after if is_trainable(name)}  # two steps: lora_B first, then lora_A too
    assert len(changed) == 2 * 4 * 2 + 4 + 2 * 2  # 2 layers x 4 projections x (A, B) + head (2 Linear: w, b) + β (w, b) x 2 layers

    inputs = torch.randint(1, cfg.task.vocab_size, (3, 40))
    mask = torch.ones(3, 40, dtype=torch.bool)
    mask[2, 25:] = False
    module.model.eval()
    with torch.no_grad():
        adapted, _ = module.model(inputs, mask)
        merged_model = merge_lora(module.model)
        merged, _ = merged_model(inputs, mask)
    assert not any("lora_" in name for name, _ in merged_model.named_parameters())
    assert torch.allclose(merged, adapted, atol=1e-5)


def test_adapters_start_as_identity_and_respect_the_config():
    cfg = compose_config(["attention=liza", lora_override()])
    model = build_model(cfg)
    inputs, mask = torch.randint(1, 17, (2, 30)), torch.ones(2, 30, dtype=torch.bool)
    model.eval()
    with torch.no_grad():
        plain, _ = model(inputs, mask)
        wrapped = instantiate(cfg.finetune)(model).eval()
        adapted, _ = wrapped(inputs, mask)
    assert torch.equal(plain, adapted)  # B = 0 at initialisation
    lora_a = wrapped.base_model.model.blocks[0].attn.q_proj.lora_A["default"].weight
    assert lora_a.shape == (8, 64)
    assert wrapped.base_model.model.blocks[0].attn.q_proj.scaling["default"] == pytest.approx(16 / 8)


def test_unknown_module_names_are_reported():
    model = build_model(compose_config(["attention=softmax"]))
    with pytest.raises(ValueError, match="finetune.target"):
        apply_lora(model, target=["o_proj"])
    with pytest.raises(ValueError, match="finetune.trainable"):
        apply_lora(model, trainable=["classifier"])


def test_cli_converts_softmax_checkpoint_to_liza_delta_with_lora(tiny_listops_overrides, tmp_path):
    """The recipe end to end: softmax weights -> LiZA (delta rule) -> LoRA fine-tuning through lra.train."""
    softmax = build_module(compose_config(["attention=softmax"]))
    ckpt = tmp_path / "softmax.ckpt"
    torch.save({"state_dict": softmax.state_dict()}, ckpt)
    run_dir = tmp_path / "liza"
    result = run_in_process(
        ["-m", "lra.train", *tiny_listops_overrides, "attention=liza", "attention/linear=delta",
         "attention.linear.chunk_size=16", f"init_from={ckpt}", lora_override(), f"hydra.run.dir={run_dir}"],
        env=SINGLE_THREAD,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 4
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    frozen = state["model.base_model.model.blocks.0.attn.q_proj.base_layer.weight"]
    assert torch.equal(frozen, softmax.model.blocks[0].attn.q_proj.weight)  # loaded, then untouched
    assert state["model.base_model.model.blocks.0.attn.q_proj.lora_B.default.weight"].abs().sum() > 0


def test_default_trains_liza_own_parameters_after_one_step(tiny_listops_overrides, tmp_path):
    """``finetune=lora`` with its defaults on LiZA (delta rule, learned gate): one optimiser step moves β's
    projection and the gate logits; every frozen base weight (projections, FFN, norms, embeddings) stays."""
    cfg = compose_config([*tiny_listops_overrides, "attention=liza", "attention/linear=delta",
                          "attention.learned_gate=true", lora_override()], tmp_path)
    L.seed_everything(0)
    module = build_module(cfg)
    module.model = instantiate(cfg.finetune)(module.model)
    params = dict(module.model.named_parameters())
    own = {name for name in params if name.rsplit(".", 1)[-1] in LIZA_OWN}
    assert len(own) == 2 * 3 and all(params[name].requires_grad for name in own)  # per layer: beta w, b, gate
    frozen = {name for name, p in params.items() if not p.requires_grad}
    assert any("q_proj.base_layer" in name for name in frozen) and any("ffn" in name for name in frozen)
    before = {name: p.detach().clone() for name, p in params.items()}
    fit(module, cfg, steps=1)
    after = dict(module.model.named_parameters())
    assert all(not torch.equal(after[name], before[name]) for name in own), sorted(own)
    assert all(torch.equal(after[name], before[name]) for name in frozen)


def test_liza_names_are_a_no_op_on_a_variant_without_them():
    """The same default config on softmax: no error, and exactly the adapters and the head are trainable."""
    cfg = compose_config(["attention=softmax", lora_override()])
    wrapped = instantiate(cfg.finetune)(build_model(cfg))
    trainable = {name for name, p in wrapped.named_parameters() if p.requires_grad}
    assert trainable == {name for name, _ in wrapped.named_parameters() if "lora_" in name or ".head." in name}
    assert list(cfg.finetune.trainable_if_present) == list(LIZA_OWN)
