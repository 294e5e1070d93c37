"""The data and the run dir checked before the first training step (lra/runtime/data_checks.py): task.num_classes
and task.vocab_size against the data, the data a resume trains on against its checkpoint's (accept_changed_data), a
missing best checkpoint, and a run dir whose checkpoints/ is gone."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.conftest import run_in_process


@pytest.mark.parametrize("override, message", [
    ("task.num_classes=2", "but task.num_classes=2 (the model's classes; the train labels go up to 9): set "
                           "task.num_classes=10"),
    ("task.vocab_size=10", "but task.vocab_size=10 (the model's embedding rows"),
])
def test_a_model_size_the_data_does_not_fit_is_named_before_training(tiny_listops_overrides, tmp_path, override,
                                                                     message):
    run_dir = tmp_path / "run"
    result = run_in_process(["-m", "lra.train", *tiny_listops_overrides, override, f"hydra.run.dir={run_dir}"])
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("[lra] FAILED: ValueError:") and message in last and "train.tsv:" in last, last
    assert json.loads((run_dir / "results.json").read_text())["steps"] == 0


def test_a_resume_checks_its_data_its_best_checkpoint_and_says_when_it_restarts(tiny_listops, tiny_listops_overrides,
                                                                               tmp_path):
    """A run failed in step 4 (checkpoints of step 2) is resumed: on edited data it is refused (the fingerprint in the
    checkpoint is not the data's) until accept_changed_data=true; with its best checkpoint deleted it is refused before
    training; with checkpoints/ deleted it says that it trains from step 0."""
    data = tmp_path / "data"
    shutil.copytree(tiny_listops, data)
    run_dir = tmp_path / "run"
    args = ["-m", "lra.train", *tiny_listops_overrides, f"task.data_dir={data}", f"hydra.run.dir={run_dir}",
            "+callbacks.faults._target_=tests.faults.Faults"]
    assert run_in_process(args, env={"LRA_FAULT_ERROR_AT": "3"}).returncode == 1
    checkpoints = run_dir / "checkpoints"
    assert torch.load(checkpoints / "last.ckpt", weights_only=False)["global_step"] == 2

    best = next(checkpoints.glob("best-*.ckpt"))
    saved = best.read_bytes()
    best.unlink()
    missing = run_in_process(args)
    assert missing.returncode == 1 and f"the run's best checkpoint {best} (the one its final test loads) is missing" \
        in missing.stderr.strip().splitlines()[-1]
    best.write_bytes(saved)

    train = data / "basic_train.tsv"
    lines = train.read_text().splitlines()
    train.write_text("\n".join([lines[0], lines[2], lines[1], *lines[3:]]) + "\n")  # two examples swapped
    refused = run_in_process(args)
    assert refused.returncode == 1, refused.stdout[-2000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert f"the data in {data} is not the data this run trained on" in last and "accept_changed_data=true" in last
    assert torch.load(checkpoints / "last.ckpt", weights_only=False)["global_step"] == 2  # nothing trained
    accepted = run_in_process([*args, "accept_changed_data=true"])
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    assert "changed since the checkpoint this run resumes from" in accepted.stdout
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed" and len(record["data_fingerprint"]) == 64

    shutil.rmtree(checkpoints)
    (run_dir / "results.json").write_text(json.dumps({**record, "status": "interrupted", "steps": 3}))
    restarted = run_in_process(args)
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    assert f"{run_dir} holds a run interrupted at step 3, but no checkpoint" in restarted.stdout
    assert "training from step 0" in restarted.stdout


def test_num_workers_below_zero_is_named_and_a_warmup_cut_to_the_run_is_noted(capsys):
    from lra.runtime.config_checks import note_short_warmup, validate
    from tests.conftest import compose_config

    with pytest.raises(ValueError, match=r"^task.datamodule.num_workers must be an integer >= 0 \(got -1\)"):
        validate(compose_config(["task.datamodule.num_workers=-1"]))
    note_short_warmup(compose_config(["trainer.max_steps=50"]))  # listops_small warms up over 100 steps
    assert "[lra] note: task.warmup_steps=100 >= trainer.max_steps=50: the warmup is cut" in capsys.readouterr().out
    note_short_warmup(compose_config(["trainer.max_steps=500"]))
    assert capsys.readouterr().out == ""
