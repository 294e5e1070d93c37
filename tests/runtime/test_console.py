"""What a run prints: one bar over its steps (also when resumed), one line per evaluation, quiet unless
``verbose=true`` (lra/runtime/progress.py, lra/runtime/console.py, lra/runtime/wandb_logger.py). Sweeps: tests/runtime/test_sweeps.py."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lra.runtime.progress import StepProgressBar
from tests.conftest import run_in_process
from tests.console_output import bar_states, other_lines


class TinyModule(L.LightningModule):
    """A linear classifier on random data that logs ``train/loss`` and ``val/acc`` as lra.module does."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        loss = nn.functional.cross_entropy(self.net(batch[0]), batch[1])
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/acc", (self.net(batch[0]).argmax(-1) == batch[1]).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(20, 4, generator=generator), torch.randint(0, 2, (20,), generator=generator))
    return DataLoader(data, batch_size=4)  # 5 batches an epoch


def fit(tmp_path, max_steps: int, ckpt_path=None) -> L.Trainer:
    trainer = L.Trainer(max_steps=max_steps, max_epochs=-1, val_check_interval=2, check_val_every_n_epoch=None,
                        callbacks=[StepProgressBar(refresh_rate=1)], logger=False, enable_checkpointing=False,
                        enable_model_summary=False, default_root_dir=tmp_path, accelerator="cpu")
    trainer.fit(TinyModule(), train_dataloaders=loader(), val_dataloaders=loader(), ckpt_path=ckpt_path)
    return trainer


def test_bar_counts_the_run_steps_across_epochs_and_a_resumed_run_starts_at_its_step(tmp_path, capsys):
    trainer = fit(tmp_path, max_steps=3)
    trainer.save_checkpoint(tmp_path / "step3.ckpt")
    first = capsys.readouterr().out
    assert bar_states(first, "train")[0] == (0, 3) and bar_states(first, "train")[-1] == (3, 3)
    assert "Epoch" not in first

    fit(tmp_path, max_steps=7, ckpt_path=tmp_path / "step3.ckpt")  # 7 steps: into the second 5-batch epoch
    resumed = capsys.readouterr().out
    states = bar_states(resumed, "train")
    assert states[0] == (3, 7) and states[-1] == (7, 7) and all(total == 7 for _, total in states)
    assert [n for n, _ in states] == sorted(n for n, _ in states)
    final = [part for part in resumed.replace("\r", "\n").splitlines() if "7/7 [" in part][-1]
    assert "<00:00, " in final and "step/s" in final and "?step/s" not in final  # time left and rate were measured
    assert "loss=" in final  # the training metrics, named without their stage
    # one line per validation (steps 4 and 6 of the resumed run), printed above the bar
    evaluations = [line for line in other_lines(resumed) if line.startswith("[lra] step")]
    assert [line.split(":")[0] for line in evaluations] == ["[lra] step 4/7", "[lra] step 6/7"]
    assert all(": val/acc " in line for line in evaluations)


def test_a_bar_needs_max_steps(tmp_path):
    trainer = L.Trainer(max_epochs=1, callbacks=[StepProgressBar()], logger=False, enable_checkpointing=False,
                        default_root_dir=tmp_path, accelerator="cpu")
    with pytest.raises(ValueError, match="set trainer.max_steps"):
        trainer.fit(TinyModule(), train_dataloaders=loader())


def test_refresh_rate_is_checked():
    with pytest.raises(ValueError, match="callbacks.progress.refresh_rate must be an integer >= 1"):
        StepProgressBar(refresh_rate=0)


def test_a_run_prints_its_dir_wandb_evaluations_and_result_only(tiny_listops_overrides, tmp_path):
    """The real CLI with W&B offline, W&B not silenced by the environment: besides the bars, six lines."""
    overrides = [o for o in tiny_listops_overrides if not o.startswith("logger=")]
    proc = run_in_process(["-m", "lra.train", *overrides, "logger=wandb", f"hydra.run.dir={tmp_path / 'run'}"],
                          env={"WANDB_SILENT": "false"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = other_lines(proc.stdout + proc.stderr)
    assert [line.split(":")[0] for line in lines[:5]] == ["[lra] run dir", "[lra] W&B", "[lra] forms", "[lra] step 2/4",
                                                         "[lra] step 4/4"], lines
    assert len(lines) == 6 and lines[5].startswith("[lra] test acc "), lines
    assert lines[2] == "[lra] forms: impl=auto attention=pytorch dropout=cpu", lines[2]  # softmax on the CPU
    wandb_dir = next((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert lines[1] == f"[lra] W&B: offline run; `wandb sync {wandb_dir}` uploads it"
    assert bar_states(proc.stdout, "train")[-1] == (4, 4)


def test_verbose_brings_back_lightning_output(tiny_listops_overrides, tmp_path):
    proc = run_in_process(["-m", "lra.train", *tiny_listops_overrides, "verbose=true",
                           f"hydra.run.dir={tmp_path / 'run'}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "Trainable params" in output  # the model summary
    assert "GPU available" in output and "Test metric" in output  # Lightning's INFO messages and test table
