"""Self-pretraining (``pretrain.steps``, lra/pretrain.py): the masked-token objective, the two-stage run, its
resume after SIGTERM, and ``init_from`` from a pretraining run."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lra.runtime.checkpoints import load_transferred_weights, read_checkpoint
from lra.runtime.interrupts import SIGTERM_EXIT_CODE
from lra.build import build_model
from lra.pretrain import build_pretrain_module, mask_tokens, validate
from lra.runtime.run_dir import RECORD, ResumeRefused, check_resume
from tests.conftest import compose_config, run_cli, run_in_process
from tests.console_output import bar_states

FAULTS = "+callbacks.faults._target_=tests.faults.Faults"


def padded_batch(vocab: int = 17, batch: int = 8, n: int = 40, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random ids with random lengths, pad id 0 after each sequence's length, as ``lra.tasks.base.collate`` builds."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(n // 4, n + 1, (batch,), generator=generator)
    key_mask = torch.arange(n) < lengths[:, None]
    ids = torch.randint(2, vocab, (batch, n), generator=generator) * key_mask
    return {"input_ids": ids, "mask": key_mask, "label": torch.randint(0, 10, (batch,), generator=generator)}


def pretrain_module(overrides: list[str] = ()):
    cfg = compose_config(["task=listops_small", "pretrain.steps=10", *overrides])
    torch.manual_seed(0)
    return build_pretrain_module(cfg)


def test_masking_touches_real_tokens_only_at_the_mask_ratio():
    batch = padded_batch(batch=64, n=200)
    ids, key_mask = batch["input_ids"], batch["mask"]
    torch.manual_seed(0)
    inputs, masked = mask_tokens(ids, key_mask, 0.3, mask_id=1)
    assert not (masked & ~key_mask).any(), "padding was masked"
    assert torch.equal(inputs[~key_mask], ids[~key_mask]) and (inputs[~key_mask] == 0).all()
    assert (inputs[masked] == 1).all() and torch.equal(inputs[key_mask & ~masked], ids[key_mask & ~masked])
    real = int(key_mask.sum())
    fraction = int(masked.sum()) / real
    assert abs(fraction - 0.3) <= 5 * math.sqrt(0.3 * 0.7 / real), (fraction, real)  # binomial, 5 sigma


def test_objective_never_reads_labels_and_is_cross_entropy_over_masked_real_tokens():
    module = pretrain_module(["pretrain.mask_id=1"]).eval()  # eval: no dropout, so only the mask draws randomness
    batch = padded_batch()
    torch.manual_seed(1)
    loss, _ = module.loss(batch)
    for other in ({**batch, "label": torch.full_like(batch["label"], 10**6)}, {k: v for k, v in batch.items() if k != "label"}):
        torch.manual_seed(1)
        assert torch.equal(module.loss(other)[0], loss), "the loss depends on the labels"

    # Independently: the same uniforms decide the mask; log-softmax of the decoder at each masked real position.
    ids, key_mask = batch["input_ids"], batch["mask"]
    torch.manual_seed(1)
    masked = (torch.rand(ids.shape) < module.mask_ratio) & key_mask
    inputs = ids.clone()
    inputs[masked] = 1
    with torch.no_grad():
        logits = module.lm_head(module.model.token_states(inputs, key_mask, {}))
    terms = [-F.log_softmax(logits[b, i], -1)[ids[b, i]] for b, i in masked.nonzero().tolist()]
    assert len(terms) > 20
    torch.testing.assert_close(loss, torch.stack(terms).mean())

    # Whatever the padding holds is neither read (attention masks it) nor predicted.
    garbage = {**batch, "input_ids": torch.where(key_mask, ids, torch.randint(2, 17, ids.shape))}
    torch.manual_seed(1)
    torch.testing.assert_close(module.loss(garbage)[0], loss)


def test_loss_falls_on_tiny_data(tiny_listops, tmp_path):
    cfg = compose_config(["task=listops_small", f"task.data_dir={tiny_listops}", f"paths.cache_dir={tmp_path}",
                          "task.batch_size=16", "pretrain.steps=60"])
    torch.manual_seed(0)
    module = build_pretrain_module(cfg)
    datamodule = instantiate(cfg.task.datamodule)
    datamodule.setup("fit")
    batches = list(datamodule.train_dataloader())

    def held_out_loss() -> float:  # a batch not trained on, the same masks every time, no dropout
        module.eval()
        torch.manual_seed(123)
        with torch.no_grad():
            loss = float(module.loss(batches[-1])[0])
        module.train()
        return loss

    before = held_out_loss()
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-3)
    for step in range(60):
        loss, _ = module.loss(batches[step % (len(batches) - 1)])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = held_out_loss()
    assert before > math.log(16) - 0.2, before  # ~uniform over the vocabulary at initialisation
    assert after < before - 0.15, (before, after)  # 2.85 -> 2.63 here (seeded, CPU)


def test_pretrain_keys_are_validated_by_name():
    for override, key in [("pretrain.steps=-1", "pretrain.steps"), ("pretrain.mask_ratio=1.0", "pretrain.mask_ratio"),
                          ("pretrain.mask_ratio=0", "pretrain.mask_ratio"), ("pretrain.mask_id=17", "pretrain.mask_id"),
                          ("pretrain.checkpoint_every=0", "pretrain.checkpoint_every"), ("pretrain.lr=0", "pretrain.lr"),
                          ("init_from=x.ckpt", "init_from")]:
        with pytest.raises(ValueError, match=key):
            validate(compose_config(["task=listops_small", "pretrain.steps=4", override]))
    validate(compose_config(["task=listops_small", "pretrain.mask_ratio=7"]))  # unused while pretrain.steps is 0


def test_resume_with_other_pretrain_settings_is_refused(tmp_path):
    def record(overrides: list[str], drop_pretrain: bool = False) -> None:
        cfg = OmegaConf.to_container(compose_config(["task=listops_small", *overrides], tmp_path), resolve=True)
        if drop_pretrain:  # a run recorded before self-pretraining existed
            del cfg["pretrain"]
        (tmp_path / RECORD).write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))

    (tmp_path / "pretrain" / "checkpoints").mkdir(parents=True)
    (tmp_path / "pretrain" / "checkpoints" / "last.ckpt").write_bytes(b"")  # a run interrupted in stage 1
    record(["pretrain.steps=8"])
    check_resume(tmp_path, compose_config(["task=listops_small", "pretrain.steps=8"], tmp_path))
    for override, named in [("pretrain.mask_ratio=0.25", "pretrain.mask_ratio: 0.5 (the run) -> 0.25"),
                            ("pretrain.steps=16", "pretrain.steps: 8 (the run) -> 16"),
                            ("pretrain.lr=1e-3", "pretrain.lr: 0.0001 (the run) -> 0.001")]:
        with pytest.raises(ResumeRefused, match=named.replace("(", r"\(").replace(")", r"\)")):
            check_resume(tmp_path, compose_config(["task=listops_small", "pretrain.steps=8", override], tmp_path))

    record([], drop_pretrain=True)  # an older record resumes without pretraining, not with it
    check_resume(tmp_path, compose_config(["task=listops_small"], tmp_path))
    with pytest.raises(ResumeRefused, match="pretrain.steps"):
        check_resume(tmp_path, compose_config(["task=listops_small", "pretrain.steps=8"], tmp_path))


def test_pretraining_run_then_init_from_its_encoder_with_softmax(tiny_listops_overrides, tmp_path):
    run_dir = tmp_path / "pretrained"
    common = [*tiny_listops_overrides, "model/positions=rotary"]
    result = run_in_process(["-m", "lra.train", *common, "attention=curformer", "attention.num_landmarks=8",
                             "pretrain.steps=8", "pretrain.checkpoint_every=4", "trainer.log_every_n_steps=1",
                             f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed" and record["pretrain_steps"] == 8 and record["steps"] == 4
    assert record["pretrain_time_s"] > 0 and record["train_time_s"] > 0
    assert [step for step, _ in record["pretrain_loss_curve"]] == list(range(8))
    assert (run_dir / "pretrain" / "checkpoints" / "last.ckpt").is_file() and (run_dir / "checkpoints" / "last.ckpt").is_file()
    metrics = list(csv.DictReader((run_dir / "csv" / "version_0" / "metrics.csv").open()))
    assert [row["pretrain/loss"] for row in metrics if row.get("pretrain/loss")], "pretrain/loss not logged"
    assert [row["val/acc"] for row in metrics if row.get("val/acc")], "the supervised stage logs to the same logger"

    encoder = run_dir / "pretrain" / "encoder.ckpt"
    state = read_checkpoint(encoder)["state_dict"]
    assert not [key for key in state if key.startswith("model.head.")] and "lm_head.weight" in state
    softmax = build_model(compose_config([*common, "attention=softmax"]))
    loaded = load_transferred_weights(softmax, encoder)
    assert loaded["skipped"] == [] and loaded["initialised"] and all(k.startswith("head.") for k in loaded["initialised"])
    assert torch.equal(softmax.token_embedding.weight, state["model.token_embedding.weight"])

    other = tmp_path / "softmax"
    result = run_in_process(["-m", "lra.train", *common, "attention=softmax", f"init_from={encoder}",
                             f"hydra.run.dir={other}"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "not in the checkpoint keep their initialisation: ['head." in result.stdout + result.stderr
    record = json.loads((other / "results.json").read_text())
    assert record["status"] == "completed" and "pretrain_steps" not in record and not (other / "pretrain").exists()


@pytest.mark.process
def test_sigterm_during_pretraining_resumes_in_stage_one(tiny_listops_overrides, tmp_path):
    run_dir = tmp_path / "run"
    args = ["-m", "lra.train", *tiny_listops_overrides, "pretrain.steps=6", "pretrain.checkpoint_every=2",
            "trainer.log_every_n_steps=1", FAULTS, f"hydra.run.dir={run_dir}"]
    first = run_cli(args, env={"LRA_FAULT_SIGTERM_AT": "3"})
    assert first.returncode == SIGTERM_EXIT_CODE, first.stderr[-3000:]
    assert "at pretraining step 3" in first.stdout
    interrupted = json.loads((run_dir / "results.json").read_text())
    assert interrupted["status"] == "interrupted" and interrupted["pretrain_step"] == 3 and interrupted["steps"] == 0
    first_part = torch.load(run_dir / "pretrain" / "checkpoints" / "interrupted-3.ckpt", weights_only=False)
    assert first_part["pretrain_time_s"] > 0  # the stage's clock so far
    assert not (run_dir / "pretrain" / "encoder.ckpt").exists() and not (run_dir / "checkpoints").exists()

    refused = run_in_process([*args, "pretrain.mask_ratio=0.25"])
    assert refused.returncode == 1 and "NOT RESUMED" in refused.stderr and "pretrain.mask_ratio" in refused.stderr

    resumed = run_in_process(args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {run_dir / 'pretrain' / 'checkpoints'}" in resumed.stdout and "(step 3)" in resumed.stdout
    # The stage's bar starts at the restored step of its 6 (lra.runtime.progress.StepProgressBar), then the supervised one
    assert bar_states(resumed.stdout, "pretrain")[0] == (3, 6) and bar_states(resumed.stdout, "pretrain")[-1] == (6, 6)
    assert bar_states(resumed.stdout, "train")[0] == (0, 4) and bar_states(resumed.stdout, "train")[-1] == (4, 4)
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed" and record["pretrain_steps"] == 6 and record["steps"] == 4
    assert record["pretrain_time_s"] > first_part["pretrain_time_s"]  # both processes' time

    # The same run never stopped: the same masks and dropout, so the same loss curve and test accuracy.
    straight = tmp_path / "straight"
    whole = run_in_process([*args[:-1], f"hydra.run.dir={straight}"])
    assert whole.returncode == 0, whole.stderr[-3000:]
    reference = json.loads((straight / "results.json").read_text())
    assert record["pretrain_loss_curve"] == reference["pretrain_loss_curve"]
    assert record["test_acc"] == reference["test_acc"] and record["val_curve"] == reference["val_curve"]
    metrics = ("csv", "version_0", "metrics.csv")  # both stages' rows, in the one file the resumed run continued
    assert run_dir.joinpath(*metrics).read_bytes() == straight.joinpath(*metrics).read_bytes()


def test_a_key_the_record_lacks_is_named_with_the_override_that_drops_it(tmp_path):
    """A key added to the configs after a run started (here attention.seed of Performer, dropped from the record)
    refuses the resume and names ``~attention.seed``; with it the command resumes."""
    cfg = OmegaConf.to_container(compose_config(["task=listops_small", "attention=performer"], tmp_path), resolve=True)
    del cfg["attention"]["seed"]
    (tmp_path / RECORD).write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    with pytest.raises(ResumeRefused, match=r"attention.seed: '<absent>' \(the run\) -> 0(.|\n)*~attention.seed on the command"):
        check_resume(tmp_path, compose_config(["task=listops_small", "attention=performer"], tmp_path))
    check_resume(tmp_path, compose_config(["task=listops_small", "attention=performer", "~attention.seed"], tmp_path))
