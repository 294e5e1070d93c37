"""lra-attention: Long Range Arena training, evaluation, reports and benchmarks."""

from pathlib import Path

from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parent.parent

# ${repo_root:} in configs: data and outputs resolve against the checkout, wherever a command is run from.
if not OmegaConf.has_resolver("repo_root"):
    OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT))
