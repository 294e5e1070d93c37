"""The run configuration outside ``python -m lra.train``: ``compose_config(overrides)`` composes
``configs/train.yaml`` exactly as the command line would (benchmarks and analysis build models with it)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig

from lra import REPO_ROOT

CONFIG_DIR = REPO_ROOT / "configs"


class OverridesRefused(SystemExit):
    """Overrides that do not compose with ``configs/train.yaml`` (a bare name, an unknown group option or key).

    A ``SystemExit`` so that the benchmark and analysis commands end on the message, not on Hydra's traceback;
    ``reason`` is Hydra's, on one line."""

    def __init__(self, overrides: list[str], reason: str):
        super().__init__(f"[lra] FAILED: the overrides {' '.join(overrides)} do not compose with configs/train.yaml: "
                         f"{reason}. Write each as key=value (e.g. attention=bigbird; the choices: "
                         f"configs/<group>/*.yaml), as `python -m lra.train` takes them.")
        self.reason = reason


def compose_config(overrides: list[str]) -> DictConfig:
    """``configs/train.yaml`` composed with ``overrides`` (the config ``python -m lra.train`` would run)."""
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose(config_name="train", overrides=overrides)
    except HydraException as error:
        reason = " ".join(str(error).split()).split(" Config search path")[0]  # Hydra's provider list adds nothing
        raise OverridesRefused(overrides, reason) from error
