"""ListOps' independent test: generated after the official splits, tested after the test split, predictions saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import run_in_process
from lra.analysis import listops_cue
from lra.tasks import listops_generator


def labels_of(path: Path) -> list[int]:
    return [int(line.rsplit("\t", 1)[1]) for line in path.read_text().splitlines()[1:] if line]


def sources_of(path: Path) -> set[str]:
    return {line.rsplit("\t", 1)[0] for line in path.read_text().splitlines()[1:] if line}


def test_generate_draws_the_independent_test_after_the_official_splits(tmp_path):
    small = dict(seed=3, min_length=10, max_length=60)
    listops_generator.generate(tmp_path / "plain", {"train": 40, "val": 10, "test": 10}, **small)
    listops_generator.generate(tmp_path / "with", {"train": 40, "val": 10, "test": 10, "independent_test": 30}, **small)
    for split in ("train", "val", "test"):  # the official splits are unchanged by the extra one
        name = f"basic_{split}.tsv"
        assert (tmp_path / "plain" / name).read_text() == (tmp_path / "with" / name).read_text()
    independent = sources_of(tmp_path / "with" / "basic_independent_test.tsv")
    assert len(independent) == 30
    for split in ("train", "val", "test"):
        assert not independent & sources_of(tmp_path / "with" / f"basic_{split}.tsv")


def test_training_tests_the_best_checkpoint_on_the_independent_test(tmp_path, tiny_listops_overrides):
    data = tmp_path / "data"
    listops_generator.generate(data, {"train": 64, "val": 32, "test": 32, "independent_test": 48}, seed=0, min_length=10,
                     max_length=60)
    overrides = [o for o in tiny_listops_overrides if not o.startswith("task.data_dir=")] + [f"task.data_dir={data}"]
    run_dir = tmp_path / "run"
    result = run_in_process(["-m", "lra.train", *overrides, "trainer.max_steps=3", f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((run_dir / "results.json").read_text())
    predictions = json.loads((run_dir / "predictions.json").read_text())
    for split, size in (("test", 32), ("independent_test", 48)):
        assert predictions[split]["label"] == labels_of(data / f"basic_{split}.tsv")  # the file's order
        assert len(predictions[split]["pred"]) == size
        right = sum(p == y for p, y in zip(predictions[split]["pred"], predictions[split]["label"]))
        # the logged metric (float32 in torchmetrics) is the saved predictions' accuracy
        assert record[f"{split}_acc"] == pytest.approx(right / size, rel=4 * torch.finfo(torch.float32).eps)
    assert "independent test acc" in result.stdout
    # the shortcut travels with the run: the first-operator cue on every evaluated split, as the probe reads the files
    cue = listops_cue.split_accuracies(data)
    assert {split: record[f"shortcut_{split}_acc"] for split in ("val", "test", "independent_test")} == cue
    assert record["train_examples"] == 64


def test_data_without_the_independent_test_keeps_working(tmp_path, tiny_listops_overrides):
    run_dir = tmp_path / "run"
    result = run_in_process(["-m", "lra.train", *tiny_listops_overrides, f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((run_dir / "results.json").read_text())
    assert record["test_acc"] is not None and "independent_test_acc" not in record
    assert set(json.loads((run_dir / "predictions.json").read_text())) == {"test"}


def test_evaluate_rebuilds_the_model_the_checkpoint_was_trained_with(tmp_path, tiny_listops_overrides):
    """No attention on the command line: the checkpoint's own (CUR, m = 4) is rebuilt, and its test accuracy
    is the training run's; a dotted override applies on top of the stored settings (``+``: the composed
    default attention, softmax, has no such key)."""
    train_dir, eval_dir, changed_dir = tmp_path / "train", tmp_path / "eval", tmp_path / "changed"
    trained = run_in_process(["-m", "lra.train", *tiny_listops_overrides, "attention=curformer",
                              "attention.num_landmarks=4", f"hydra.run.dir={train_dir}"])
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    record = json.loads((train_dir / "results.json").read_text())
    data_overrides = [o for o in tiny_listops_overrides if o.startswith(("task=", "task.data_dir=", "paths.", "logger="))]
    evaluated = run_in_process(["-m", "lra.evaluate", f"ckpt_path={record['best_checkpoint']}", *data_overrides,
                                f"hydra.run.dir={eval_dir}"])
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    result = json.loads((eval_dir / "results.json").read_text())
    assert result["config"]["attention"]["name"] == "curformer" and result["config"]["attention"]["num_landmarks"] == 4
    assert result["test_acc"] == record["test_acc"]
    assert result["shortcut_test_acc"] == record["shortcut_test_acc"]  # the same data: the same cue
    assert json.loads((eval_dir / "predictions.json").read_text()) == json.loads((train_dir / "predictions.json").read_text())
    changed = run_in_process(["-m", "lra.evaluate", f"ckpt_path={record['best_checkpoint']}", *data_overrides,
                              "+attention.num_landmarks=2", f"hydra.run.dir={changed_dir}"])
    assert changed.returncode == 0, changed.stdout[-3000:] + changed.stderr[-3000:]
    changed_config = json.loads((changed_dir / "results.json").read_text())["config"]["attention"]
    assert (changed_config["name"], changed_config["num_landmarks"]) == ("curformer", 2)
