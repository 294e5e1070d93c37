"""lra-attention: Long Range Arena training, evaluation, reports and benchmarks."""

import importlib.util
import sys
import warnings
from pathlib import Path

# The packages every command imports first: a Python without them (the venv not activated) gets one line saying so
# instead of a ModuleNotFoundError from the middle of an import (find_spec looks without importing).
REQUIRED = ("omegaconf", "hydra", "torch", "lightning")
if missing := [name for name in REQUIRED if importlib.util.find_spec(name) is None]:
    sys.exit(f"[lra] FAILED: {sys.executable} has no {', '.join(missing)}: this is not the project's Python. Activate "
             f"its venv (source .venv/bin/activate, made by `make setup`) or run .venv/bin/python -m lra...")

from omegaconf import OmegaConf  # noqa: E402  (after the check above)

REPO_ROOT = Path(__file__).resolve().parent.parent

# ${repo_root:} in configs: data and outputs resolve against the checkout, wherever a command is run from.
if not OmegaConf.has_resolver("repo_root"):
    OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT))

# Our launcher configs extend the Hydra plugins' schemas of the same name, which Hydra announces on every launch
# (the message starts with a newline: (?s) lets .* cross it).
warnings.filterwarnings("ignore", message="(?s).*is validated against ConfigStore schema with the same name",
                        category=UserWarning)
