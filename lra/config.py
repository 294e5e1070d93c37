"""The run configuration outside ``python -m lra.train``: ``compose_config(overrides)`` composes
``configs/train.yaml`` exactly as the command line would (benchmarks and analysis build models with it)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from lra import REPO_ROOT

CONFIG_DIR = REPO_ROOT / "configs"


def compose_config(overrides: list[str]) -> DictConfig:
    """``configs/train.yaml`` composed with ``overrides`` (the config ``python -m lra.train`` would run)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)
