"""Every new LRA task trains a few steps through ``python -m lra.train`` on official-format fixtures.

The fixtures sit in the default layout under one ``paths.data_dir`` (what ``python -m lra.data
download`` produces), so the task configs' ``data_dir`` defaults are exercised too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lra.train import train
from tests.conftest import compose_config, run_in_process
from tests.tasks.test_tasks_image import write_cifar
from tests.tasks.test_tasks_pathfinder import write_pathfinder
from tests.tasks.test_tasks_retrieval import write_aan
from tests.tasks.test_tasks_text import write_imdb

FEW_STEPS = ["task.batch_size=4", "task.warmup_steps=1", "trainer.max_steps=2", "task.eval_every=2", "logger=csv"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_imdb(root / "aclImdb")
    write_aan(root / "lra_release" / "tsv_data")
    write_cifar(root / "cifar-10-batches-py")
    write_pathfinder(root / "lra_release" / "pathfinder32" / "curv_contour_length_14", resolution=32, count=21)
    write_pathfinder(root / "lra_release" / "pathfinder16" / "curv_contour_length_14", resolution=16, count=21)
    return root


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_text_retrieval_image_pathfinder_train_in_one_sweep(data_dir, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_in_process([
        "-m", "lra.train", "-m", "task=text,retrieval,image,pathfinder", f"paths.data_dir={data_dir}",
        f"paths.cache_dir={tmp_path / 'cache'}", *FEW_STEPS, f"hydra.sweep.dir={sweep}",
    ])
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {results(path.parent)["task"]: results(path.parent) for path in sweep.glob("*/results.json")}
    assert sorted(runs) == ["image", "pathfinder", "retrieval", "text"]
    for name, record in runs.items():
        assert record["status"] == "completed" and record["steps"] == 2, (name, record.get("error"))
        assert 0.0 <= record["test_acc"] <= 1.0
    assert runs["retrieval"]["config"]["task"]["head"]["_target_"] == "models.heads.PairHead"
    assert {path.name.split("-")[0] for path in (tmp_path / "cache").iterdir()} == {"text", "retrieval", "image", "pathfinder32"}


def test_pathx_trains_a_few_steps_at_a_small_resolution(data_dir, tmp_path):
    """Path-X's config (``task=pathx``) at 16 px: the 128 px model is too slow for a CPU test; the reader is
    tested at 128 px in test_tasks_pathfinder.py. Runs ``lra.train.train`` in-process (the CLI's body)."""
    cfg = compose_config(["task=pathx", "task.resolution=16", "task.max_length=256", f"paths.data_dir={data_dir}",
                          f"paths.cache_dir={tmp_path / 'cache'}", *FEW_STEPS], output_dir=tmp_path / "run")
    assert cfg.task.data_dir == str(data_dir / "lra_release" / "pathfinder16" / "curv_contour_length_14")
    metrics = train(cfg, tmp_path / "run")
    assert metrics["steps"] == 2 and 0.0 <= metrics["test_acc"] <= 1.0
    assert [path.name.split("-")[0] for path in (tmp_path / "cache").iterdir()] == ["pathfinder16"]
