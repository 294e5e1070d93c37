"""experiment=listops_deep: the deep ListOps recipe builds for every attention and trains on the CPU."""

from __future__ import annotations

import json
import os

import pytest
import torch

from lra.build import build_module
from tests.conftest import compose_config, run_in_process
from tests.test_configs import options

ATTENTIONS = [*options("attention"), "linear/elu", "linear/delta"]


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_the_recipe_builds_and_steps_for_every_attention(attention, tmp_path):
    l1_scores = attention in ("l1", "l1_cur")  # rotary positions are refused there: the config comment says so
    cfg = compose_config(["experiment=listops_deep", "task=listops_small", f"attention={attention}",
                          *(["model/positions=learned"] if l1_scores else [])], output_dir=tmp_path)
    if attention == "flashcur" and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            build_module(cfg)
        return
    assert (cfg.model.num_layers, cfg.model.d_model, cfg.model.ffn_dim, cfg.model.dropout) == (6, 80, 160, 0.0)
    assert cfg.model.num_heads == (1 if attention.startswith("mega") else 4)
    assert cfg.model.positions._target_.endswith("LearnedPositions" if l1_scores else "RotaryPositions")
    assert (cfg.task.batch_size, cfg.task.augment, cfg.task.group_by_length) == (64, "shuffle", True)
    assert (cfg.optimizer.lr, cfg.optimizer.weight_decay, cfg.trainer.precision) == (1e-3, 0.01, "32-true")
    module = build_module(cfg)
    ids = torch.randint(2, 17, (2, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.arange(24) < torch.tensor([[24], [17]])
    logits, _ = module(ids, mask)
    logits.float().sum().backward()
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)


def test_the_recipe_trains_and_tests_on_the_cpu(tiny_listops_overrides, tmp_path):
    """The issue's command (experiment=listops_deep task=listops_small attention=curformer) on the tiny data."""
    overrides = [o for o in tiny_listops_overrides if not o.startswith(("task.batch_size", "task.warmup_steps"))]
    run = run_in_process(["-m", "lra.train", "experiment=listops_deep", *overrides, "attention=curformer",
                          "trainer.max_steps=4", "task.eval_every=2", f"hydra.run.dir={tmp_path / 'run'}"])
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["status"] == "completed" and record["steps"] == 4 and 0.0 <= record["test_acc"] <= 1.0
    config = record["config"]
    assert config["task"]["augment"] == "shuffle" and config["task"]["batch_size"] == 64 and config["model"]["num_layers"] == 6
    assert "listops_deep" in config["tags"]
