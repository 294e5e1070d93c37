"""lra-attention: Long Range Arena training, evaluation, reports and benchmarks."""

import warnings
from pathlib import Path

from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parent.parent

# ${repo_root:} in configs: data and outputs resolve against the checkout, wherever a command is run from.
if not OmegaConf.has_resolver("repo_root"):
    OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT))

# Our launcher configs extend the Hydra plugins' schemas of the same name, which Hydra announces on every launch
# (the message starts with a newline: (?s) lets .* cross it).
warnings.filterwarnings("ignore", message="(?s).*is validated against ConfigStore schema with the same name",
                        category=UserWarning)
