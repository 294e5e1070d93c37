"""Who may write into a run dir, and what a re-run resumes from.

A run dir belongs to the run whose settings ``config_resolved.yaml`` records (written, atomically, before
the first checkpoint). A command run into a dir that holds checkpoints resumes that run only when its
resolved config is the recorded one, apart from keys that cannot change the result (:data:`NEUTRAL`);
otherwise it is refused before anything is written there (:func:`check_resume`). A resume starts from the
checkpoint that loads with the highest step; one that does not is named and moved aside as ``*.corrupt``
(:func:`resume_checkpoint`). A run dir may be moved or copied between a stop and its resume
(:class:`lra.runtime.callbacks.RelocatableCheckpoint` reads the checkpoint state's paths relative to where it is now).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from lra.runtime.checkpoints import UnsafeCheckpoint, load_checkpoint_file
from lra.runtime.results import compared_settings
from lra.tasks.files import atomic_write_text, remove_partial_writes

RECORD = "config_resolved.yaml"
# Keys that cannot change what a run computes: where it logs and caches, how it reports progress.
NEUTRAL = ("logger", "paths", "hydra", "tags", "group", "callbacks.progress", "callbacks.checkpoint.dirpath",
           "callbacks.last_checkpoint.dirpath", "task.datamodule.cache_dir", "task.datamodule.num_workers",
           "trainer.log_every_n_steps", "trainer.enable_model_summary", "trainer.enable_progress_bar", "verbose",
           "accept_changed_data")


class ResumeRefused(SystemExit):
    """A command would resume a run with other settings; nothing in the run dir was written."""


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain values, interpolations resolved (unresolved where one cannot be resolved)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:
        return OmegaConf.to_container(cfg, resolve=False)


def is_neutral(key: str) -> bool:
    return any(key == prefix or key.startswith(prefix + ".") for prefix in NEUTRAL)


def settings_differences(recorded: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """``(key, recorded, current)`` for every key outside :data:`NEUTRAL` whose value differs (a key of
    :data:`lra.runtime.results.ADDED_LATER` the record lacks counts as its value there, one of ``ADDED_LATER_DERIVED`` not at all)."""
    old, new = compared_settings(recorded, current)
    keys = sorted(key for key in old.keys() | new.keys()
                  if not is_neutral(key) and old.get(key, "<absent>") != new.get(key, "<absent>"))
    return [(key, old.get(key, "<absent>"), new.get(key, "<absent>")) for key in keys]


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoints, newest first (by modification time)."""
    folder = Path(run_dir) / "checkpoints"
    return sorted(folder.glob("*.ckpt"), key=lambda path: path.stat().st_mtime_ns, reverse=True) if folder.is_dir() else []


def recorded_config(run_dir: Path) -> dict | None:
    """The settings the run in ``run_dir`` was started with, or None when it holds no readable record."""
    try:
        return OmegaConf.to_container(OmegaConf.load(Path(run_dir) / RECORD), resolve=False)
    except Exception:
        return None


def stage_checkpoints(run_dir: Path) -> list[Path]:
    """Every checkpoint of the run, the self-pretraining stage's (``pretrain/``) included."""
    pretrain = Path(run_dir) / "pretrain"
    return [*checkpoints(run_dir), *checkpoints(pretrain), *pretrain.glob("encoder.ckpt")]


def drop_unused_pretrain(recorded: dict, current: dict) -> tuple[dict, dict]:
    """Both configs without their ``pretrain`` node when neither pretrains (``pretrain.steps`` 0, or no node: a
    record from before self-pretraining existed): its other keys change nothing then. Otherwise both as they are."""
    if (recorded.get("pretrain") or {}).get("steps") or (current.get("pretrain") or {}).get("steps"):
        return recorded, current
    return tuple({key: value for key, value in config.items() if key != "pretrain"} for config in (recorded, current))


def check_resume(run_dir: Path, cfg: DictConfig) -> None:
    """Raise :class:`ResumeRefused` (naming each key with both values) when ``run_dir`` holds checkpoints (of either
    stage) of a run started with other settings. Reads only; run it before anything can write into ``run_dir``."""
    found = stage_checkpoints(run_dir)
    recorded = recorded_config(run_dir) if found else None
    if recorded is None:
        return
    differences = settings_differences(*drop_unused_pretrain(recorded, resolved(cfg)))
    if not differences:
        return
    lines = "\n".join(f"  {key}: {old!r} (the run) -> {new!r} (this command)" for key, old, new in differences)
    unset = [key for key, old, _ in differences if old == "<absent>"]
    hint = (f" The run's record lacks {', '.join(unset)} (a key added to the configs since it started?): if the run "
            f"computed as this command's value, {' '.join('~' + key for key in unset)} on the command line resumes it "
            "with the code's default, as it ran.") if unset else ""
    raise ResumeRefused(
        f"[lra] NOT RESUMED: {run_dir} holds an unfinished run ({found[0].name}) started with other settings:\n{lines}\n"
        f"A resume continues a run as it was started, so nothing in {run_dir} was changed. To finish that run, re-run "
        f"it with its own settings ({Path(run_dir) / RECORD}).{hint} To train these settings, use a new run dir (drop "
        f"hydra.run.dir, or another one); to start them from that run's weights, add init_from={found[0]} there."
    )


def claim(run_dir: Path, cfg: DictConfig) -> None:
    """Record this run's settings in ``run_dir`` (rank 0 only), after :func:`check_resume` let it in; first remove
    the temporary files of writes a killed process cut short (``.best-10.ckpt.<random>.tmp`` of a SIGKILL during a
    save): this process owns the dir now (:mod:`lra.runtime.run_lock`), so no other one is writing them."""
    if rank_zero_only.rank == 0:
        run_dir = Path(run_dir)
        folders = (run_dir, run_dir / "checkpoints", run_dir / "pretrain", run_dir / "pretrain" / "checkpoints")
        removed = [path for folder in folders for path in remove_partial_writes(folder)]
        if removed:
            print(f"[lra] removed {len(removed)} temporary file(s) of a write cut short by a kill: "
                  f"{', '.join(path.name for path in removed[:3])}{', ...' if len(removed) > 3 else ''}", flush=True)
        atomic_write_text(run_dir / RECORD, OmegaConf.to_yaml(OmegaConf.create(resolved(cfg))))


def checkpoint_step(path: Path) -> int:
    """The ``global_step`` a checkpoint was saved at, read without loading its tensors (``mmap``; an old
    non-zip file is loaded whole) and with ``weights_only=True`` (:func:`lra.runtime.checkpoints.load_checkpoint_file`);
    raises when the file does not load, :class:`lra.runtime.checkpoints.UnsafeCheckpoint` when it needs another type."""
    try:
        return load_checkpoint_file(path, mmap=True)["global_step"]
    except UnsafeCheckpoint:
        raise
    except Exception:
        return load_checkpoint_file(path)["global_step"]


def resume_checkpoint(run_dir: Path) -> tuple[Path | None, int | None]:
    """The checkpoint of ``run_dir`` that loads with the highest step (of those, the newest) and its step, or
    ``(None, None)`` (train from scratch). By step, not by file time: a run dir copied without its times (``cp -r``)
    resumes from the same checkpoint as the original.

    A checkpoint that does not load (cut short by a full disk or a kill during an old, non-atomic write) is
    named with the reason and renamed ``<name>.corrupt`` (rank 0; the other ranks only skip it). One that needs a type
    no checkpoint of ``lra.train`` holds is not moved: the run stops on its :class:`lra.runtime.checkpoints.UnsafeCheckpoint`
    (a file someone put there, to be looked at, not resumed around)."""
    found, loaded = checkpoints(run_dir), []
    for newest, path in enumerate(found):
        try:
            loaded.append((checkpoint_step(path), -newest, path))
        except UnsafeCheckpoint:
            raise
        except Exception as error:
            if rank_zero_only.rank == 0:
                path.replace(path.with_name(path.name + ".corrupt"))
            print(f"[lra] {path} does not load ({type(error).__name__}: {str(error).strip()[:200]}): moved aside to "
                  f"{path.name}.corrupt; trying the other checkpoints", flush=True)
    if loaded:
        step, _, path = max(loaded)
        print(f"[lra] resuming from {path} (step {step})", flush=True)
        return path, step
    if found:
        print(f"[lra] no checkpoint of {run_dir} loads: training from scratch", flush=True)
    return None, None
