"""Reading and writing checkpoints: atomic saves, weights across attention variants (direct transfer and
``init_from`` fine-tuning), errors that name the file.

**No checkpoint runs code.** Every read of a checkpoint goes through :func:`load_checkpoint_file`:
``torch.load(weights_only=True)``, whose unpickler builds tensors, numbers, strings and plain containers and
nothing else. That is all a checkpoint of ``lra.train`` holds (weights, optimiser and schedule state, callback
and loader states, the random streams as tensors and lists, the run's settings as plain dicts), so no type is
allowlisted beyond torch's own (``torch.serialization.add_safe_globals`` is not needed; what a callback or module adds
to a checkpoint must stay plain). A file that names any other Python object is refused when the unpickler meets
that name, before the object is built: :class:`UnsafeCheckpoint`, naming the file and the type. The readers:
``init_from`` and ``lra.evaluate`` (:func:`read_checkpoint`), the resume's choice of checkpoint
(:func:`lra.runtime.run_dir.checkpoint_step`) and Lightning's own ``ckpt_path`` loads in ``trainer.fit`` /
``trainer.test`` (:meth:`AtomicCheckpointIO.load_checkpoint`)."""

from __future__ import annotations

import errno
import logging
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

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

    def load_checkpoint(self, path, map_location=None, weights_only: bool | None = None) -> dict:
        """Lightning's read of ``ckpt_path`` (a resume in ``trainer.fit``, the best checkpoint in ``trainer.test``):
        :func:`load_checkpoint_file`, so ``weights_only=True`` whatever the caller passes."""
        if not Path(path).exists():
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        return load_checkpoint_file(path, map_location or "cpu")

    @staticmethod
    def write(checkpoint: dict, tmp: Path) -> None:
        """``torch.save`` through a Python file: a failed write then keeps its ``OSError`` (and errno) as the
        context of torch's ``RuntimeError`` (saving to a path, torch's own writer reports only the position)."""
        with open(tmp, "wb") as handle:
            torch.save(checkpoint, handle)


class UnsafeCheckpoint(ValueError):
    """A checkpoint that needs a Python object other than tensors and plain containers to load: refused unloaded."""


def load_checkpoint_file(path: str | Path, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)``; a file that needs another type raises :class:`UnsafeCheckpoint`
    (torch's restricted unpickler stops at the type's name, before anything is built from it)."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        needed = re.search(r"GLOBAL (\S+)", str(error))
        if needed is None:  # a damaged pickle stream, not a foreign type
            raise
        raise UnsafeCheckpoint(
            f"{path} needs {needed.group(1)} to load, a type no checkpoint of lra.train holds: refused unloaded, as "
            f"unpickling it could run code. Use a checkpoint written by lra.train (or one you can vouch for, "
            f"re-saved as plain tensors and containers)") from error


def read_checkpoint(ckpt_path: str | Path) -> dict:
    """``torch.load`` of a run's ``.ckpt``, with an error naming the file, what is wrong with it and what to do."""
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path} (init_from / ckpt_path expects a .ckpt file of a run)")
    try:
        checkpoint = load_checkpoint_file(path)
    except UnsafeCheckpoint:
        raise
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


def run_settings(cfg: DictConfig) -> dict:
    """What a checkpoint records of its run (``settings``): the resolved :data:`CHECKPOINT_SETTINGS` nodes and the task's
    name (``task``, which :func:`load_transferred_weights` names when weights of another task do not fit)."""
    settings = {group: OmegaConf.to_container(cfg[group], resolve=True) for group in CHECKPOINT_SETTINGS}
    return {**settings, "task": cfg.task.name}


def checkpoint_task(checkpoint: dict) -> str | None:
    """The task a checkpoint was trained on: ``settings.task`` (recorded since 2026-11-28), else the class Lightning
    keeps the datamodule's state under (``ListOpsDataModule``: every checkpoint of ``lra.train`` has it); None for
    neither (a pretraining stage's ``encoder.ckpt`` of before)."""
    recorded = (checkpoint.get("settings") or {}).get("task")
    classes = [key for key in checkpoint if isinstance(key, str) and key.endswith("DataModule")]
    return recorded or (classes[0] if classes else None)


def other_task(checkpoint: dict, task: DictConfig | None) -> str | None:
    """The checkpoint's task when it is not ``task`` (this run's ``cfg.task``), else None. A checkpoint that records
    only its datamodule class is compared by class (``task=listops`` and ``listops_small`` share one)."""
    recorded = checkpoint_task(checkpoint)
    if task is None or recorded is None:
        return None
    ours = task.name if "task" in (checkpoint.get("settings") or {}) else task.datamodule._target_.rsplit(".", 1)[-1]
    return None if recorded == ours else recorded


def kind(name: str) -> str:
    """A parameter's name with its layer indices as ``*`` (``blocks.1.ffn.0.weight`` -> ``blocks.*.ffn.*.weight``)."""
    return re.sub(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)", "*", name)


def listed(names: list[str], most: int = 6) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most else "")


def load_transferred_weights(model: nn.Module, ckpt_path: str | Path, task: DictConfig | None = None) -> dict[str, list[str]]:
    """Load a Lightning checkpoint's ``model.*`` weights into ``model`` (``task``: this run's ``cfg.task``, to name a
    checkpoint of another task as the cause when its weights do not fit).

    The transfer rules (docs/attention.md "Direct weight transfer"): every parameter the two share must match in
    shape; a parameter of a kind only the model has (Nyström's ``attend.conv``, LiZA's gate, Proxyformer's
    ``proxies``, the head after a pretraining stage's ``encoder.ckpt``) keeps its initialisation, and one of a kind
    only the checkpoint has (the other attention's own) is skipped; both are named in the log and returned as
    ``{"skipped": [...], "initialised": [...]}``. Anything else is a ``ValueError`` raised before a weight is
    loaded, naming what matched and what did not: no shared parameter at all, or one of a kind both have left
    out on one side (``blocks.2.*`` of a 3-block model from a 2-block checkpoint: another depth or layout).
    A kind is a name with its layer indices as ``*`` (:func:`kind`).
    """
    path = Path(ckpt_path)
    checkpoint = read_checkpoint(path)
    state = {k[len(MODEL_PREFIX):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(MODEL_PREFIX)}
    own = model.state_dict()
    mismatched = [f"{k}: {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in state.items() if k in own and v.shape != own[k].shape]
    foreign = other_task(checkpoint, task)
    if mismatched and foreign:
        raise ValueError(f"{path} was trained on task {foreign} and this run is task={task.name}: its weights have "
                         f"that task's shapes ({listed(mismatched, 3)}; checkpoint vs this model). Evaluate or fine-tune "
                         f"it on its own task (task=... of that run), or give a checkpoint trained on {task.name}")
    if mismatched:
        raise ValueError(f"{path}: parameters with different shapes (change the model config to match):\n  " + "\n  ".join(mismatched))
    shared = sorted(set(state) & set(own))
    skipped = sorted(set(state) - set(own))
    initialised = sorted(set(own) - set(state))
    own_kinds, their_kinds = {kind(k) for k in own}, {kind(k) for k in state}
    missing = [k for k in initialised if kind(k) in their_kinds]  # a kind the checkpoint has, but not this one
    unplaced = [k for k in skipped if kind(k) in own_kinds]
    if not shared or missing or unplaced:
        found = (f"{len(shared)} of the model's {len(own)} parameters match ({listed(shared)})" if shared else
                 f"no parameter of the model is in it (the checkpoint's: {listed(sorted(state))}; the model's: "
                 f"{listed(sorted(own))})")
        gaps = "".join([f"; the model's {listed(missing)} have no weights there although it has their kind" if missing else "",
                        f"; its {listed(unplaced)} have no place in the model although the model has their kind" if unplaced else ""])
        raise ValueError(f"{path} does not fit this model: {found}{gaps}. A checkpoint transfers to another attention "
                         f"of the same model (lra.evaluate takes the model from the checkpoint unless the command names "
                         f"model=...); give the model config it was trained with, or train from scratch (no init_from)")
    if foreign:
        print(f"[lra] {path} was trained on task {foreign}; its weights fit this run's task={task.name} and are loaded",
              flush=True)
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
