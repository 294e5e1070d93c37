"""Reading and writing checkpoints: atomic saves, weights across attention variants (direct transfer and
``init_from`` fine-tuning), errors that name the file."""

from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path

import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from torch import nn

from lra.tasks.files import atomic_write

log = logging.getLogger(__name__)
MODEL_PREFIX = "model."


FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # no space left; disk quota exceeded


class DiskFull(OSError):
    """A checkpoint could not be written for want of space; the message names the file and the space left."""


def is_disk_full(error: BaseException | None) -> bool:
    """Whether ``error``, or an error it was raised from or while handling, is a full disk or quota. ``torch.save``
    reports one as ``RuntimeError: [enforce fail at inline_container.cc:...] unexpected pos ...``, raised while
    handling the file's ``OSError(ENOSPC)``."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in FULL_DISK_ERRNOS:
            return True
        error = error.__cause__ or error.__context__
    return False


def readable_size(size: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if size < 1000:
            break
        size /= 1000
    return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, atomic on local disks: the checkpoint goes to a temporary file beside its
    final name, is fsynced, then renamed (:func:`lra.tasks.files.atomic_write`), so a full disk or a kill during
    a save leaves the previous file (or none), never a cut-short one, and a failed save leaves no temporary file.
    A full disk raises :class:`DiskFull`: ``disk full while writing <path> (<free> left): ...``.
    ``lra.runtime.trainer.build_trainer`` adds it to every trainer (DDP included: rank 0 saves)."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        path = Path(path)
        try:
            atomic_write(path, lambda tmp: self.write(checkpoint, tmp))
        except Exception as error:
            if not is_disk_full(error):
                raise
            free = readable_size(shutil.disk_usage(path.parent).free)
            raise DiskFull(f"disk full while writing {path} ({free} left): free space, then re-run the same command "
                           f"to resume") from error

    @staticmethod
    def write(checkpoint: dict, tmp: Path) -> None:
        """``torch.save`` through a Python file: a failed write then keeps its ``OSError`` (and errno) as the
        context of torch's ``RuntimeError`` (saving to a path, torch's own writer reports only the position)."""
        with open(tmp, "wb") as handle:
            torch.save(checkpoint, handle)


def read_checkpoint(ckpt_path: str | Path) -> dict:
    """``torch.load`` of a run's ``.ckpt``, with an error naming the file, what is wrong with it and what to do."""
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path} (init_from / ckpt_path expects a .ckpt file of a run)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise ValueError(f"{path} is not a readable checkpoint ({type(error).__name__}: {str(error).strip()[:200]}): "
                         f"it is cut short (a full disk or a kill while it was written) or not a .ckpt of lra.train; "
                         f"use another checkpoint of the run (checkpoints/best-*.ckpt, last.ckpt)") from error
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ValueError(f"{path} loads but is not a Lightning checkpoint (no state_dict); pass a .ckpt of lra.train")
    return checkpoint


# The config groups a checkpoint carries: what lra.evaluate and the diagnostics need to rebuild the trained model.
CHECKPOINT_SETTINGS = ("attention", "model")
POSITIONS_BY_FLAG = {True: "models.positions.LearnedPositions", False: "models.positions.NoPositions"}


def training_settings(ckpt_path: str | Path) -> dict | None:
    """The ``attention`` and ``model`` settings a checkpoint was trained with (None if it predates them),
    in today's keys: ``model.learned_positions: bool`` (before ``model/positions``) becomes the
    equivalent ``model.positions`` node."""
    settings = read_checkpoint(ckpt_path).get("settings")
    model = (settings or {}).get("model", {})
    if "learned_positions" in model:
        model["positions"] = {"_target_": POSITIONS_BY_FLAG[bool(model.pop("learned_positions"))], "_partial_": True}
    return settings


def load_transferred_weights(model: nn.Module, ckpt_path: str | Path) -> dict[str, list[str]]:
    """Load a Lightning checkpoint's ``model.*`` weights into ``model``.

    Every parameter the two models share must match in shape (strict). Parameters only the
    checkpoint has (skipped) or only ``model`` has (left at their initialisation) are named in the
    log and returned as ``{"skipped": [...], "initialised": [...]}``.
    """
    path = Path(ckpt_path)
    checkpoint = read_checkpoint(path)
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


def with_checkpoint_settings(cfg: DictConfig, overrides: list[str], ckpt_path: str | Path) -> DictConfig:
    """``cfg`` with the ``attention`` and ``model`` nodes ``ckpt_path`` was trained with (stored by
    ``lra.train``), except a group the command line chooses (``attention=...``, ``model=...``, ``model/...=``,
    or an ``experiment``); dotted overrides (``attention.num_landmarks=32``) apply on top of the stored node.
    Checkpoints written before the settings were stored keep the composed config (a note says so)."""
    stored = training_settings(ckpt_path)
    if not stored:
        print(f"[lra] {ckpt_path} holds no training settings (written before they were stored): the model is "
              f"built from the command line's attention={cfg.attention.name} and model config", flush=True)
        return cfg
    parsed = OverridesParser.create().parse_overrides(overrides)
    chosen = {override.key_or_group.split("/")[0] for override in parsed if "." not in override.key_or_group}
    for group in CHECKPOINT_SETTINGS:
        if group in chosen or "experiment" in chosen:
            continue
        node = OmegaConf.create(stored[group])
        for override in parsed:
            if override.key_or_group.startswith(f"{group}."):
                OmegaConf.update(node, override.key_or_group[len(group) + 1:], override.value(), force_add=True)
        with open_dict(cfg):
            cfg[group] = node
        print(f"[lra] {group} from the checkpoint: {stored[group].get('name', stored[group].get('_target_'))}", flush=True)
    return cfg
