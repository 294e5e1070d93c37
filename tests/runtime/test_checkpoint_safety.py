"""No checkpoint runs code, and weights that do not fit are an error (lra/runtime/checkpoints.py).

A real checkpoint of ``lra.train`` with one more entry, an object whose unpickling would create a marker file
(``open``, pickled as ``io.open``) or run a shell command (``os.system``), is handed to every reader: ``init_from`` (with and
without ``finetune``), ``lra.evaluate``, a resumed run dir and Lightning's own ``ckpt_path`` reader. Each refuses it
in one line naming the file and the type, and the marker never appears."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from lra.build import build_datamodule, build_model, build_module
from lra.runtime.checkpoints import AtomicCheckpointIO, UnsafeCheckpoint, load_transferred_weights, read_checkpoint
from lra.runtime.run_dir import checkpoint_step
from lra.runtime.trainer import build_trainer
from tests.conftest import compose_config, run_in_process


class OpensAFile:
    """Unpickled, calls ``open(marker, "w")``: creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


class RunsACommand:
    """Unpickled, runs ``touch <marker>`` in a shell (the issue's example)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def tiny(tiny_listops, tmp_path_factory) -> list[str]:
    return [
        "task=listops_small", f"task.data_dir={tiny_listops}", f"paths.cache_dir={tmp_path_factory.mktemp('cache')}",
        "task.batch_size=16", "task.warmup_steps=1", "trainer.max_steps=2", "task.eval_every=2", "logger=csv",
        "+trainer.limit_val_batches=1", "+trainer.limit_test_batches=1",
    ]


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory) -> Path:
    """The run dir of a softmax model trained 2 steps by ``python -m lra.train``."""
    run_dir = tmp_path_factory.mktemp("run")
    result = run_in_process(["-m", "lra.train", *tiny, f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def with_payload(source: Path, target: Path, payload) -> Path:
    checkpoint = torch.load(source, weights_only=True)
    checkpoint["note"] = payload
    torch.save(checkpoint, target)
    return target


@pytest.fixture
def poisoned(trained, tmp_path) -> tuple[Path, Path]:
    """A copy of the run's last checkpoint with an entry that creates ``marker`` when unpickled."""
    marker = tmp_path / "MARKER"
    return with_payload(trained / "checkpoints" / "last.ckpt", tmp_path / "shared.ckpt", OpensAFile(marker)), marker


def failed_line(result) -> str:
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("payload, needed", [(OpensAFile, "io.open"), (RunsACommand, "posix.system")])
def test_every_reader_refuses_a_payload_naming_the_file_and_the_type(trained, tmp_path, payload, needed):
    marker = tmp_path / "MARKER"
    path = with_payload(trained / "checkpoints" / "last.ckpt", tmp_path / "shared.ckpt", payload(marker))
    readers = (read_checkpoint, checkpoint_step, AtomicCheckpointIO().load_checkpoint)  # init_from/evaluate, resume pick, Lightning
    for read in readers:
        with pytest.raises(UnsafeCheckpoint, match=rf"^{path} needs {needed} to load, a type no checkpoint of lra.train holds"):
            read(path)
    assert not marker.exists()
    assert read_checkpoint(trained / "checkpoints" / "last.ckpt")["global_step"] == 2  # the real one loads


@pytest.mark.parametrize("extra", [[], pytest.param(["attention=liza", "finetune=lora"], marks=pytest.mark.slow)],
                         ids=["init_from", "finetune"])  # finetune: the same load, before the LoRA wrapper
def test_init_from_a_payload_is_refused_before_training(poisoned, tiny, tmp_path, extra):
    path, marker = poisoned
    run_dir = tmp_path / "run"
    line = failed_line(run_in_process(["-m", "lra.train", *tiny, *extra, f"init_from={path}", f"hydra.run.dir={run_dir}"]))
    assert line.startswith(f"[lra] FAILED: UnsafeCheckpoint: {path} needs io.open to load")
    assert not marker.exists() and not (run_dir / "checkpoints").exists()


def test_evaluate_refuses_a_payload(poisoned, tiny, tmp_path):
    path, marker = poisoned
    line = failed_line(run_in_process(["-m", "lra.evaluate", *tiny, f"ckpt_path={path}", f"hydra.run.dir={tmp_path / 'eval'}"]))
    assert line.startswith(f"[lra] FAILED: UnsafeCheckpoint: {path} needs io.open to load")
    assert not marker.exists()


def test_a_resumed_run_dir_with_a_payload_is_refused_and_the_file_kept(trained, tiny, tmp_path):
    run_dir = tmp_path / "copied"
    shutil.copytree(trained, run_dir)
    (run_dir / "results.json").unlink()  # an unfinished run: the re-run resumes it
    marker = tmp_path / "MARKER"
    last = with_payload(trained / "checkpoints" / "last.ckpt", run_dir / "checkpoints" / "last.ckpt", OpensAFile(marker))
    line = failed_line(run_in_process(["-m", "lra.train", *tiny, f"hydra.run.dir={run_dir}"]))
    assert line.startswith(f"[lra] FAILED: UnsafeCheckpoint: {last} needs io.open to load")
    assert not marker.exists() and last.is_file()  # not moved aside as *.corrupt: it is named for someone to look at


def test_lightning_reads_ckpt_path_through_the_weights_only_reader(poisoned, tiny, tmp_path):
    """``trainer.test(ckpt_path=...)`` (and ``trainer.fit``'s resume) load through the trainer's checkpoint IO."""
    path, marker = poisoned
    cfg = compose_config([*tiny, "logger=none"], tmp_path)
    trainer = build_trainer(cfg, tmp_path)
    with pytest.raises(UnsafeCheckpoint, match=rf"^{path} needs io.open to load"):
        trainer.test(build_module(cfg), datamodule=build_datamodule(cfg), ckpt_path=str(path), verbose=False)
    assert not marker.exists()


def rewritten(source: Path, target: Path, change) -> Path:
    checkpoint = torch.load(source, weights_only=True)
    change(checkpoint)
    torch.save(checkpoint, target)
    return target


def test_a_checkpoint_sharing_no_parameter_is_refused_naming_both_sides(trained, tiny, tmp_path):
    def rename(checkpoint):
        checkpoint["state_dict"] = {key.replace("model.", "model.other."): value
                                    for key, value in checkpoint["state_dict"].items()}
    path = rewritten(trained / "checkpoints" / "last.ckpt", tmp_path / "other.ckpt", rename)
    model = build_model(compose_config(tiny))
    with pytest.raises(ValueError, match=rf"^{path} does not fit this model: no parameter of the model is in it \(the "
                                         rf"checkpoint's: other\.blocks\.0\..*; the model's: blocks\.0\."):
        load_transferred_weights(model, path)


def test_another_depth_is_named_not_trained_from_half_its_weights(trained, tiny):
    deeper = build_model(compose_config([*tiny, "model.num_layers=3"]))
    with pytest.raises(ValueError, match=r"does not fit this model: 40 of the model's 56 parameters match .*; the "
                                         r"model's blocks\.2\.attn\.k_proj\.bias, .* \(16 in all\) have no weights there"):
        load_transferred_weights(deeper, trained / "checkpoints" / "last.ckpt")
    shallower = build_model(compose_config([*tiny, "model.num_layers=1"]))
    with pytest.raises(ValueError, match=r"its blocks\.1\.attn\.k_proj\.bias, .* \(16 in all\) have no place in the model"):
        load_transferred_weights(shallower, trained / "checkpoints" / "last.ckpt")


def test_new_kinds_of_parameter_keep_their_initialisation_and_are_named(trained, tiny):
    """Softmax -> Proxyformer (docs/proxyformer.md): everything loads but ``proxies`` and ``landmark_proj``."""
    proxy = build_model(compose_config([*tiny, "attention=proxyformer"]))
    report = load_transferred_weights(proxy, trained / "checkpoints" / "last.ckpt")
    assert report["skipped"] == [] and report["initialised"] == [
        *(f"blocks.{i}.attn.landmark_proj.{p}" for i in (0, 1) for p in ("bias", "weight")), "proxies"]


def test_a_checkpoint_of_another_task_names_both_tasks(trained, tiny, tmp_path):
    eval_dir = tmp_path / "eval"
    line = failed_line(run_in_process(["-m", "lra.evaluate", *tiny, "task=text", f"ckpt_path={trained / 'checkpoints' / 'last.ckpt'}",
                                       f"hydra.run.dir={eval_dir}"]))
    assert f"was trained on task listops_small and this run is task=text: its weights have that task's shapes (" in line
    assert "give a checkpoint trained on text" in line and "change the model config" not in line
    # a checkpoint from before settings.task: its datamodule's class names the task
    old = rewritten(trained / "checkpoints" / "last.ckpt", tmp_path / "old.ckpt", lambda c: c["settings"].pop("task"))
    cfg = compose_config([*tiny, "task=text"])
    with pytest.raises(ValueError, match=rf"{old} was trained on task ListOpsDataModule and this run is task=text"):
        load_transferred_weights(build_model(cfg), old, cfg.task)
    record = json.loads((eval_dir / "results.json").read_text())
    assert record["status"] == "failed"


RUNS = Path(__file__).resolve().parents[2] / "docs" / "runs"
# One committed checkpoint of each format: before the stored settings, with metrics.csv's row count (a GPU run), MEGA.
FORMATS = ("listops_curformer_sum_full_s0/best-4250.ckpt", "listops_megacur_lr1e-3_3000_gpu_s0/best-2750.ckpt",
           "listops_megacur_pretrain2500_lr1e-3_full_s0/best-4000.ckpt")


def test_committed_checkpoints_of_each_format_load_as_data():
    """Checkpoints written before this check hold no type beyond torch's weights-only set either."""
    for name in FORMATS:
        assert checkpoint_step(RUNS / name) == read_checkpoint(RUNS / name)["global_step"] > 0


@pytest.mark.slow
def test_every_committed_checkpoint_loads_as_data():
    committed = sorted(RUNS.rglob("*.ckpt"))
    assert len(committed) > len(FORMATS) and all(checkpoint_step(path) > 0 for path in committed)
