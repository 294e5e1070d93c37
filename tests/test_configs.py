"""Every option of every config group composes, and the objects it describes instantiate."""

from __future__ import annotations

import os

import pytest
import torch
from hydra.utils import instantiate

from lra import REPO_ROOT
from lra.build import build_module
from tests.conftest import compose_config

CONFIGS = REPO_ROOT / "configs"


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIGS / group).glob("*.yaml"))


@pytest.mark.parametrize("attention", options("attention"))
def test_every_attention_builds_a_model(attention, tmp_path):
    cfg = compose_config([f"attention={attention}", "task=listops_small"], output_dir=tmp_path)
    if attention == "flashcur" and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):  # never a silent fallback
            build_module(cfg)
        return
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
        task = ["task=listops"] if (group, option) == ("model", "mega_lra") else []  # MEGA's protocol needs an LRA task
        cfg = compose_config([f"{group}={option}", *task], output_dir=tmp_path)
        node = cfg[group]
        if group == "trainer" and node.accelerator == "gpu" and not torch.cuda.is_available():
            continue  # composes (checked above); building it needs a GPU

        if group in ("logger", "callbacks"):
            objects = [instantiate(child) for child in (node or {}).values()]
            assert all(obj is not None for obj in objects)
        elif group == "trainer":
            trainer = instantiate(node, logger=False, enable_checkpointing=False)
            assert trainer.max_steps == cfg.task.max_steps
        elif node:
            assert callable(instantiate(node))


@pytest.mark.parametrize(("override", "named"), [("bigbird", "missing EQUAL"),
                                                 ("attention=bigbrd", "Could not find 'attention/bigbrd'"),
                                                 ("attention.no_such_key=1", "Could not override 'attention.no_such_key'")])
def test_overrides_that_do_not_compose_end_on_a_message(override, named):
    """The benchmark and analysis commands compose with lra.config.compose_config: a bad override ends the command
    with Hydra's reason and how to write one, not with Hydra's traceback (a SystemExit, exit code 1)."""
    from lra.config import OverridesRefused, compose_config as compose_for_commands

    with pytest.raises(OverridesRefused) as refusal:
        compose_for_commands(["task=listops", override])
    message = str(refusal.value.code)
    assert named in message and override in message and "key=value" in message
    assert "Config search path" not in message
