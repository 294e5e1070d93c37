"""Direct weight transfer (CUR paper §7–8): a softmax checkpoint evaluated / fine-tuned with other
attentions through the real CLI and the real training code; every variant trains end to end."""

import json
from itertools import product
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from lra.evaluate import evaluate
from lra.train import train
from tests.conftest import CONFIG_DIR, compose_config, run_in_process

TINY_MAX_LENGTH = 60  # tiny_listops: lengths 10-60


@pytest.fixture(scope="module")
def tiny_overrides(tiny_listops, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return [
        "task=listops_small",
        f"task.data_dir={tiny_listops}",
        f"paths.cache_dir={cache}",
        "task.batch_size=16",
        "task.warmup_steps=2",
        "trainer.max_steps=4",
        "task.eval_every=2",
        "logger=csv",
    ]


@pytest.fixture(scope="module")
def softmax_run(tiny_overrides, tmp_path_factory) -> dict:
    """A softmax model trained 4 steps by ``python -m lra.train``: its results.json."""
    run_dir = tmp_path_factory.mktemp("softmax_run")
    result = run_in_process(["-m", "lra.train", *tiny_overrides, "attention=softmax", f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed" and Path(record["best_checkpoint"]).is_file()
    return record


def test_softmax_checkpoint_evaluates_identically_as_cur_with_m_covering_every_token(softmax_run, tiny_overrides, tmp_path):
    ckpt = softmax_run["best_checkpoint"]
    result = run_in_process([
        "-m", "lra.evaluate", *tiny_overrides, f"ckpt_path={ckpt}", "attention=curformer",
        f"attention.num_landmarks={TINY_MAX_LENGTH}", f"hydra.run.dir={tmp_path}",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["status"] == "completed" and record["attention"] == "curformer"
    assert record["transferred_from"] == str(Path(ckpt).resolve())
    assert record["skipped"] == [] and record["initialised"] == []
    assert record["test_acc"] == softmax_run["test_acc"]


def test_transfer_to_nystromformer_names_its_new_parameters(softmax_run, tiny_overrides, tmp_path):
    cfg = compose_config([*tiny_overrides, "attention=nystromformer", f"+ckpt_path={softmax_run['best_checkpoint']}"], tmp_path)
    metrics = evaluate(cfg, tmp_path)
    assert metrics["initialised"] == ["blocks.0.attn.attend.conv.weight", "blocks.1.attn.attend.conv.weight"]
    assert metrics["skipped"] == [] and 0.0 <= metrics["test_acc"] <= 1.0


def test_evaluate_names_a_missing_checkpoint(tiny_overrides, tmp_path):
    cfg = compose_config([*tiny_overrides, f"+ckpt_path={tmp_path / 'nope.ckpt'}"], tmp_path)
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        evaluate(cfg, tmp_path)


def test_init_from_starts_training_from_the_checkpoint(softmax_run, tiny_overrides, tmp_path):
    """With lr = 1e-30 (0 is refused) the fine-tuned CUR model keeps the softmax weights (to 1e-25), so its
    test accuracy is the source's."""
    cfg = compose_config([
        *tiny_overrides, "attention=curformer", f"attention.num_landmarks={TINY_MAX_LENGTH}",
        f"init_from={softmax_run['best_checkpoint']}", "optimizer.lr=1e-30",
    ], tmp_path)
    assert train(cfg, tmp_path)["test_acc"] == softmax_run["test_acc"]
    source = torch.load(softmax_run["best_checkpoint"], weights_only=False)["state_dict"]
    tuned = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert source.keys() == tuned.keys()
    assert all(torch.allclose(source[name].float(), tuned[name].float(), rtol=0, atol=1e-25) for name in source)


@pytest.mark.parametrize("attention", ["curformer", "nystromformer", "l1", "l1_cur"])
def test_every_variant_trains(attention, tiny_overrides, tmp_path):
    cfg = compose_config([*tiny_overrides, f"attention={attention}", "attention.num_landmarks=8"
                          if attention != "l1" else "attention.lam=1.0"], tmp_path)
    metrics = train(cfg, tmp_path)
    assert metrics["steps"] == 4 and 0.0 <= metrics["test_acc"] <= 1.0


def test_table4_experiment_sweeps_five_rules_by_five_seeds():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=["experiment=cur_table4_selection"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    rules, seeds = params["attention.selection"].split(","), params["seed"].split(",")
    assert sorted(rules) == ["abs", "embed", "random", "step", "sum"] and len(seeds) == 5
    assert len(list(product(rules, seeds))) == 25
    assert cfg.attention.name == "curformer" and cfg.task.name == "listops" and "cur_table4_selection" in cfg.tags


def test_evaluate_with_a_missing_checkpoint_is_one_line_and_writes_nothing(tmp_path):
    logs = tmp_path / "outputs"
    proc = run_in_process(["-m", "lra.evaluate", f"ckpt_path={tmp_path / 'absent.ckpt'}", f"paths.log_dir={logs}"])
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"[lra] FAILED: ckpt_path={tmp_path / 'absent.ckpt'}: no such file. Give a checkpoint")
    assert not logs.exists()


def test_evaluate_with_an_unreadable_checkpoint_fails_in_one_line_with_its_traceback_logged(tmp_path):
    ckpt = tmp_path / "broken.ckpt"
    ckpt.write_bytes(b"not a checkpoint")
    run_dir = tmp_path / "evaluation"
    proc = run_in_process(["-m", "lra.evaluate", f"ckpt_path={ckpt}", f"hydra.run.dir={run_dir}", "logger=none"])
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(f"[lra] FAILED: ValueError: {ckpt} is not a readable checkpoint")
    assert "Traceback" not in proc.stdout + proc.stderr and "Traceback" in (run_dir / "error.log").read_text()
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "failed" and record["transferred_from"] == str(ckpt)
