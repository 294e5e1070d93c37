"""Loading weights across attention variants (direct transfer and ``init_from`` fine-tuning)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)
MODEL_PREFIX = "model."


def load_transferred_weights(model: nn.Module, ckpt_path: str | Path) -> dict[str, list[str]]:
    """Load a Lightning checkpoint's ``model.*`` weights into ``model``.

    Every parameter the two models share must match in shape (strict). Parameters only the
    checkpoint has (skipped) or only ``model`` has (left at their initialisation) are named in the
    log and returned as ``{"skipped": [...], "initialised": [...]}``.
    """
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path} (init_from / ckpt_path expects a .ckpt file of a run)")
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    state = {k[len(MODEL_PREFIX):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(MODEL_PREFIX)}
    own = model.state_dict()
    mismatched = [f"{k}: {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in state.items() if k in own and v.shape != own[k].shape]
    if mismatched:
        raise ValueError(f"{path}: parameters with different shapes (change the model config to match):\n  " + "\n  ".join(mismatched))
    skipped = sorted(set(state) - set(own))
    initialised = sorted(set(own) - set(state))
    model.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)
    if skipped:
        log.warning("%s: skipped %d checkpoint parameter(s) the model does not have: %s", path, len(skipped), skipped)
    if initialised:
        log.warning("%s: %d parameter(s) not in the checkpoint keep their initialisation: %s", path, len(initialised), initialised)
    return {"skipped": skipped, "initialised": initialised}
