"""Every attention variant trains under ``trainer.precision=bf16-mixed`` on CPU with a finite loss.

The real config, module, datamodule and Lightning trainer, in-process (no subprocess start-up per
variant): a few optimiser steps on tiny generated ListOps, then the checks

* every logged training loss is finite (the float32 islands of docs/design.md §1 — pseudo-inverse, CUR,
  Nyström, L1 distance — keep bf16 from blowing up),
* autocast really ran: some ``nn.Linear`` produced bfloat16 (else the test would pass in float32),
* the parameters are finite after the optimiser steps.

``flashcur`` is left out: its kernels need CUDA or the Triton interpreter (``tests/kernels/test_flashcur.py``).
"""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from hydra.utils import instantiate

from lra import REPO_ROOT
from lra.build import build_module
from lra.train import build_trainer
from tests.conftest import compose_config

VARIANTS = sorted(p.stem for p in (REPO_ROOT / "configs" / "attention").glob("*.yaml") if p.stem != "flashcur")
EXTRA = {"liza_delta": ["attention=liza", "attention/linear=delta", "attention.linear.chunk_size=16"]}
SHORT = {"linformer": ["attention.k=32"]}  # settings that task.max_length=64 below needs (Linformer refuses k > n)


class Record(L.Callback):
    """Training losses per step, and the dtypes ``nn.Linear`` layers produced."""

    def __init__(self):
        self.losses: list[float] = []
        self.linear_dtypes: set[torch.dtype] = set()

    def on_fit_start(self, trainer, pl_module):
        for layer in pl_module.modules():
            if isinstance(layer, torch.nn.Linear):
                layer.register_forward_hook(lambda _mod, _inp, out: self.linear_dtypes.add(out.dtype))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def test_every_variant_is_covered():
    """A new configs/attention/*.yaml joins the parametrization below by itself; check the list is real."""
    assert {"softmax", "curformer", "nystromformer", "l1", "l1_cur", "proxyformer", "mega", "megacur", "liza"} <= set(VARIANTS)


@pytest.mark.parametrize("variant", [*VARIANTS, *EXTRA])
def test_trains_under_bf16_mixed_on_cpu(variant, tiny_listops_overrides, tmp_path):
    overrides = [
        *tiny_listops_overrides,
        *EXTRA.get(variant, [f"attention={variant}"]),
        "trainer.precision=bf16-mixed",
        "trainer.max_steps=3",
        "task.eval_every=3",
        "task.max_length=64",
        *SHORT.get(variant, []),
        "task.batch_size=8",
        "logger=none",
        "+trainer.limit_val_batches=1",
        "+trainer.limit_test_batches=1",
    ]
    cfg = compose_config(overrides, output_dir=tmp_path)
    torch.set_num_threads(1)
    L.seed_everything(0)
    module = build_module(cfg)
    trainer = build_trainer(cfg, tmp_path)
    record = Record()
    trainer.callbacks.append(record)
    trainer.fit(module, datamodule=instantiate(cfg.task.datamodule))
    assert trainer.precision == "bf16-mixed"
    assert len(record.losses) == 3, record.losses
    assert all(math.isfinite(loss) for loss in record.losses), f"{variant}: bf16-mixed losses {record.losses}"
    assert torch.bfloat16 in record.linear_dtypes, f"{variant}: autocast never produced bf16 ({record.linear_dtypes})"
    assert all(torch.isfinite(p).all() for p in module.parameters()), f"{variant}: non-finite parameters after 3 steps"
