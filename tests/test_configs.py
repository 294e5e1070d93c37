"""Every option of every config group composes, and the objects it describes instantiate."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate

from lra import REPO_ROOT
from lra.module import build_module
from tests.conftest import compose_config

CONFIGS = REPO_ROOT / "configs"


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIGS / group).glob("*.yaml"))


@pytest.mark.parametrize("attention", options("attention"))
def test_every_attention_builds_a_model(attention, tmp_path):
    cfg = compose_config([f"attention={attention}", "task=listops_small"], output_dir=tmp_path)
    module = build_module(cfg)
    assert sum(p.numel() for p in module.parameters()) > 0


@pytest.mark.parametrize("task", options("task"))
def test_every_task_composes_with_required_keys(task):
    cfg = compose_config([f"task={task}"])
    for key in ("name", "vocab_size", "num_classes", "max_length", "data_dir", "batch_size",
                "warmup_steps", "max_steps", "eval_every", "datamodule", "head"):
        assert key in cfg.task, f"configs/task/{task}.yaml lacks '{key}'"
    assert cfg.task.datamodule.data_dir == cfg.task.data_dir


@pytest.mark.parametrize("group", ["trainer", "logger", "callbacks", "optimizer", "scheduler", "model"])
def test_every_option_of_the_other_groups_instantiates(group, tmp_path):
    for option in options(group):
        if option in ("ddp",):  # multi-GPU strategy: instantiating it needs GPUs; composition is still checked
            compose_config([f"{group}={option}"], output_dir=tmp_path)
            continue
        cfg = compose_config([f"{group}={option}"], output_dir=tmp_path)
        node = cfg[group]
        if group in ("logger", "callbacks"):
            objects = [instantiate(child) for child in (node or {}).values()]
            assert all(obj is not None for obj in objects)
        elif group == "trainer":
            trainer = instantiate(node, logger=False, enable_checkpointing=False)
            assert trainer.max_steps == cfg.task.max_steps
        elif group == "model":
            assert build_module(compose_config([f"model={option}"], output_dir=tmp_path)) is not None
        elif node:
            assert callable(instantiate(node))
