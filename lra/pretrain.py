"""Self-pretraining (``pretrain.steps > 0``): a masked-token denoising stage on the train split's inputs before
the supervised stage (``configs/pretrain/default.yaml``; README "Self-pretraining"; docs/design.md §3).

Objective (Amos, Berant & Gupta, "Never Train from Scratch", ICLR 2024, arXiv 2310.02980): every real token
(``key_mask`` True) is masked independently with probability ρ = ``pretrain.mask_ratio`` (0.5); a masked token's
input id becomes ``pretrain.mask_id`` (the reference's 0); the encoder's final per-token states go through a
per-position linear decoder ``Linear(d_model, vocab_size)`` and the loss is the cross-entropy on the masked
positions only:

    L = −(1/|M|) Σ_{(b, i) ∈ M} log softmax(W h_{b,i} + c)[x_{b,i}],   M = {(b, i): key_mask_{b,i} ∧ u_{b,i} < ρ}

with ``u ~ U(0, 1)`` from torch's global generator (seeded by ``seed``; stored in every checkpoint with the
datamodule's state, so a resumed stage draws the masks it would have drawn). Padding is never masked, never
predicted, and stays padding (key-masked) in the input. Labels are never read. Retrieval's two documents
``(B, 2, n)`` are pretrained as ``2B`` sequences, as the encoder encodes them (one document at a time).

The classifier's head is not part of this stage (replaced by ``nn.Identity``), so the checkpoints hold
``model.*`` (the encoder) and ``lm_head.*`` (the decoder): ``init_from=<run dir>/pretrain/encoder.ckpt``
(:func:`lra.runtime.checkpoints.load_transferred_weights`) loads the encoder, skips the decoder and leaves the head at
its initialisation.

:func:`pretrain_stage` runs the stage in ``<run dir>/pretrain/`` (``lra.train`` calls it before the supervised stage).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from lra.build import build_datamodule
from lra.module import optimizers_per_step
from lra.runtime.callbacks import LastCheckpoint
from lra.runtime.config_checks import is_int
from lra.runtime.run_dir import resume_checkpoint
from lra.runtime.stage_clock import StageClock
from lra.runtime.trainer import build_trainer

ENCODER_CHECKPOINT = "encoder.ckpt"  # <run dir>/pretrain/encoder.ckpt: written when the stage ends, marks it done
# Callbacks of configs/callbacks/ that belong to the supervised stage (best-val checkpoint, validation, its
# last.ckpt); the pretraining stage keeps the others (progress bar, non-finite loss, memory gate, test faults).
SUPERVISED_ONLY = ("checkpoint", "validate_last_step", "last_checkpoint")
IGNORE = -100  # cross-entropy's ignore_index: the targets of unmasked and padding positions


def validate(cfg) -> None:
    """The ``pretrain`` keys, checked before anything runs, each error naming its key."""
    node = cfg.pretrain
    if not is_int(node.steps) or node.steps < 0:
        raise ValueError(f"pretrain.steps must be an integer >= 0 (got {node.steps!r}); 0 = no pretraining, "
                         "e.g. pretrain.steps=1000")
    if not node.steps:
        return
    if isinstance(node.mask_ratio, bool) or not isinstance(node.mask_ratio, (int, float)) or not 0 < node.mask_ratio < 1:
        raise ValueError(f"pretrain.mask_ratio must be a number in (0, 1) (got {node.mask_ratio!r}); e.g. 0.5 (Amos et al.)")
    if not is_int(node.mask_id) or not 0 <= node.mask_id < cfg.task.vocab_size:
        raise ValueError(f"pretrain.mask_id must be an integer token id in [0, task.vocab_size={cfg.task.vocab_size}) "
                         f"(got {node.mask_id!r}); e.g. pretrain.mask_id=0 (the reference's)")
    lr = node.lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"pretrain.lr must be a finite number > 0 (got {lr!r}); e.g. pretrain.lr=1e-4")
    if not is_int(node.warmup_steps) or node.warmup_steps < 0:
        raise ValueError(f"pretrain.warmup_steps must be an integer >= 0 (got {node.warmup_steps!r})")
    if not is_int(node.checkpoint_every) or node.checkpoint_every < 1:
        raise ValueError(f"pretrain.checkpoint_every must be an integer >= 1 (got {node.checkpoint_every!r})")
    if cfg.get("init_from"):
        raise ValueError(f"init_from={cfg.init_from} and pretrain.steps={node.steps} both set: pretraining starts from "
                         "scratch; drop init_from, or pretrain.steps=0 to fine-tune from that checkpoint")


def mask_tokens(input_ids: torch.Tensor, key_mask: torch.Tensor, ratio: float, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(masked input ids, masked)``, both ``(B, n)``: each real token (``key_mask`` True) is masked with
    probability ``ratio`` (torch's global generator) and its id replaced by ``mask_id``; padding is left as it is."""
    masked = (torch.rand(input_ids.shape, device=input_ids.device) < ratio) & key_mask
    return torch.where(masked, torch.full_like(input_ids, mask_id), input_ids), masked


class PretrainModule(L.LightningModule):
    """The classifier's encoder (head replaced by ``nn.Identity``) plus ``lm_head`` ``Linear(d_model, vocab_size)``,
    trained on the masked-token objective of the module docstring; logs ``pretrain/loss`` (and every auxiliary
    loss of the blocks as ``pretrain/<name>``, added to the loss as in supervised training).

    ``loss_curve`` lists ``[step, loss]`` every ``curve_every`` steps and at the last one (kept in checkpoints,
    written to ``results.json`` as ``pretrain_loss_curve``). ``settings`` as in :class:`lra.module.LRAModule`."""

    stage_name = "pretrain"  # the progress bar's name (lra.runtime.progress)

    def __init__(self, model: nn.Module, vocab_size: int, mask_ratio: float, mask_id: int,
                 optimizer: Callable[..., torch.optim.Optimizer],
                 scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler] | None,
                 settings: dict | None = None, curve_every: int = 10):
        super().__init__()
        model.head = nn.Identity()  # the supervised stage's head is fresh: none is trained or saved here
        self.model = model
        self.lm_head = nn.Linear(model.token_embedding.embedding_dim, vocab_size)
        self.mask_ratio = mask_ratio
        self.mask_id = mask_id
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.settings = settings
        self.curve_every = curve_every
        self.loss_curve: list[list[float]] = []
        self.clock = StageClock()  # the stage's wall time over every process of a resumed stage

    def loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Masked-token cross-entropy of a batch (its ``input_ids`` and ``mask`` only) and the auxiliary losses."""
        ids, key_mask = batch["input_ids"].flatten(0, -2), batch["mask"].flatten(0, -2)  # (B, n); Retrieval: (2B, n)
        inputs, masked = mask_tokens(ids, key_mask, self.mask_ratio, self.mask_id)
        aux_losses: dict[str, torch.Tensor] = {}
        logits = self.lm_head(self.model.token_states(inputs, key_mask, aux_losses))  # (B, n, vocab)
        targets = torch.where(masked, ids, IGNORE)
        total = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum")
        return total / masked.sum().clamp(min=1), aux_losses  # no host sync; a batch with nothing masked gives 0

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, aux_losses = self.loss(batch)
        batch_size = len(batch["input_ids"])
        for name, value in aux_losses.items():
            self.log(f"pretrain/{name}", value, batch_size=batch_size)
            loss = loss + value
        self.log("pretrain/loss", loss, prog_bar=True, batch_size=batch_size)
        step = self.global_step
        if step % self.curve_every == 0 or step + 1 == self.trainer.max_steps:
            self.loss_curve.append([step, float(loss.detach())])  # one host sync every curve_every steps
        return loss

    def on_fit_start(self) -> None:
        self.clock.start()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["pretrain_loss_curve"] = self.loss_curve
        checkpoint["settings"] = self.settings
        checkpoint["pretrain_time_s"] = self.clock.seconds()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.loss_curve = list(checkpoint.get("pretrain_loss_curve", []))
        self.clock.before = checkpoint.get("pretrain_time_s") or 0.0

    def configure_optimizers(self) -> dict:
        return optimizers_per_step(self.optimizer_factory, self.scheduler_factory, self.parameters())


class PretrainCheckpoint(LastCheckpoint):
    """:class:`lra.runtime.callbacks.LastCheckpoint` for a stage without validation: ``last.ckpt`` every ``every`` steps,
    at the end, and on SIGTERM or Ctrl-C (``interrupted-<step>.ckpt`` too)."""

    def __init__(self, dirpath: str, every: int):
        super().__init__(dirpath=dirpath)
        self.every = every

    def on_train_batch_end(self, trainer: L.Trainer, *args, **kwargs) -> None:
        if trainer.global_step % self.every == 0 and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


def build_pretrain_module(cfg) -> PretrainModule:
    """:class:`PretrainModule` for ``cfg``: the run's classifier (``lra.build.build_model``), AdamW with
    ``pretrain.lr`` and ``pretrain.scheduler`` (OneCycle over ``pretrain.steps``)."""
    from hydra.utils import instantiate

    from lra.runtime.checkpoints import run_settings
    from lra.build import build_model

    node = cfg.pretrain
    scheduler = instantiate(node.scheduler) if node.get("scheduler") else None
    return PretrainModule(build_model(cfg), cfg.task.vocab_size, node.mask_ratio, node.mask_id,
                          instantiate(cfg.optimizer, lr=node.lr), scheduler, run_settings(cfg),
                          curve_every=cfg.trainer.get("log_every_n_steps") or 10)


def pretrain_callbacks(cfg, stage_dir: Path) -> list[L.Callback]:
    """The stage's checkpointing (:class:`PretrainCheckpoint` in ``<stage dir>/checkpoints``) and the configured
    callbacks that are not the supervised stage's own (:data:`SUPERVISED_ONLY`)."""
    from hydra.utils import instantiate

    kept = [instantiate(node) for key, node in (cfg.callbacks or {}).items() if key not in SUPERVISED_ONLY]
    return [PretrainCheckpoint(str(stage_dir / "checkpoints"), cfg.pretrain.checkpoint_every), *kept]


def read_encoder_record(path: Path) -> dict:
    """What ``results.json`` records of a finished stage, from its ``encoder.ckpt``."""
    from lra.runtime.checkpoints import read_checkpoint

    checkpoint = read_checkpoint(path)
    return {"pretrain_steps": checkpoint["global_step"], "pretrain_time_s": checkpoint.get("pretrain_time_s"),
            "pretrain_loss_curve": checkpoint.get("pretrain_loss_curve", [])}


def pretrain_stage(cfg, run_dir: Path, loggers: list) -> tuple[Path, dict]:
    """Self-pretraining in ``<run dir>/pretrain/``: ``pretrain.steps`` steps on the train split, no validation,
    ``last.ckpt`` every ``pretrain.checkpoint_every`` steps in ``pretrain/checkpoints/`` (resumed from when
    interrupted), then ``pretrain/encoder.ckpt`` (weights, loss curve, wall time), which marks the stage done: a
    re-run reads it and goes on to the supervised stage. Returns its path and the record (:func:`read_encoder_record`)."""
    stage_dir = run_dir / "pretrain"
    encoder = stage_dir / ENCODER_CHECKPOINT
    if not encoder.is_file():
        L.seed_everything(cfg.seed, workers=True)
        datamodule = build_datamodule(cfg)
        module = build_pretrain_module(cfg)
        trainer = build_trainer(cfg, stage_dir, loggers, pretrain_callbacks(cfg, stage_dir), max_steps=cfg.pretrain.steps,
                                limit_val_batches=0, num_sanity_val_steps=0, enable_model_summary=False)
        resume_from, _ = resume_checkpoint(stage_dir)
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
        except BaseException as error:
            error.step, error.pretrain_step = 0, trainer.global_step  # no supervised step yet
            raise
        trainer.save_checkpoint(encoder, weights_only=True)  # with the stage's wall time (its clock)
    print(f"[lra] pretraining done: {encoder}; the supervised stage starts from its encoder", flush=True)
    return encoder, read_encoder_record(encoder)
