"""The LightningModule (cross-entropy + auxiliary losses, torchmetrics accuracy, AdamW + schedule) and how it runs
the network (:func:`compile_in_place`). Building it from a config: :mod:`lra.build`."""

from __future__ import annotations

from typing import Callable

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MaxMetric
from torchmetrics.classification import MulticlassAccuracy

from lra.runtime.stage_clock import StageClock


class LRAModule(L.LightningModule):
    """Trains ``model(input_ids, mask) -> (logits, aux_losses)``; logs ``train/loss``, ``train/acc``,
    ``val/acc``, ``val/acc_best``, ``<split>/acc`` for every test split of the datamodule (``test/acc``,
    ListOps' ``independent_test/acc``) and every auxiliary loss as ``train/<name>``.

    ``test_predictions`` holds, after ``trainer.test``, each test split's predicted and true labels in
    the loader's order (this process's share of them under DDP). ``val_curve`` lists ``[step, val acc]``
    for every evaluation (kept in checkpoints, written to ``results.json``: the learning curve
    ``lra.analysis.report --curves`` plots). ``settings`` (the run's resolved ``attention`` and ``model``
    config nodes) is stored in every checkpoint, so ``lra.evaluate`` rebuilds the trained model from it.
    ``compile_network`` (``model.compile``): :meth:`configure_model` compiles the network with ``torch.compile``."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler] | None,
        num_classes: int,
        settings: dict | None = None,
        compile_network: bool = False,
    ):
        super().__init__()
        self.model = model
        self.compile_network = compile_network
        self.compiled = False
        self.settings = settings
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.num_classes = num_classes
        self.test_split_names: list[str] = []
        self.test_accs = nn.ModuleDict()
        self.test_predictions: dict[str, dict[str, list]] = {}
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # survives resume from last.ckpt
        self.samples_seen = 0  # training samples of this rank, over every process of a resumed run
        self.clock = StageClock()  # training wall time, over every process of a resumed run
        self.val_curve: list[list[float]] = []

    def configure_model(self) -> None:
        """Compile the network once when ``compile_network`` (Lightning calls this hook at the start of fit,
        validate and test, after ``lra.train`` wrapped the network for fine-tuning).

        ``nn.Module.compile`` compiles in place: the compiled call is held beside the eager module, whose
        parameters stay where they were, so the state dict and checkpoints have the eager model's keys (no
        ``_orig_mod.`` prefix) and load into a module compiled or not. Compilation itself happens on the
        first call in train mode and on the first in eval mode, each for that batch's shape, and on CPU once more
        in each mode with dynamic shapes at the first batch of another length (PyTorch's default; compiling
        dynamic from the start miscompiles Proxyformer in torch 2.13); on a GPU once per batch shape, each step
        then captured in CUDA graphs (:func:`compile_in_place`; ``lra.train`` pads batches to few shapes,
        :func:`build_datamodule`)."""
        if self.compile_network and not self.compiled:
            device = self.device if self._trainer is None else self._trainer.strategy.root_device
            compile_in_place(self.model, device)
            self.compiled = True
            print("[lra] model.compile=true: torch.compile compiles the network at its first training and evaluation "
                  + ("batches, each batch shape once, and captures its steps in CUDA graphs" if device.type == "cuda"
                     else "batches and again, with dynamic shapes, at the first batch of another length (minutes on a "
                          "CPU)"), flush=True)

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return self.model(input_ids, mask)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits, aux_losses = self(batch["input_ids"], batch["mask"])
        loss = F.cross_entropy(logits.float(), batch["label"])
        batch_size = len(batch["label"])
        for name, value in aux_losses.items():
            self.log(f"train/{name}", value, batch_size=batch_size)
            loss = loss + value
        self.train_acc(logits, batch["label"])
        self.log("train/loss", loss, prog_bar=True, batch_size=batch_size)
        self.log("train/acc", self.train_acc, prog_bar=True, batch_size=batch_size)
        self.samples_seen += batch_size
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        logits, _ = self(batch["input_ids"], batch["mask"])
        self.val_acc(logits, batch["label"])
        self.log("val/acc", self.val_acc, prog_bar=True, sync_dist=True, batch_size=len(batch["label"]))

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            return
        accuracy = self.val_acc.compute()
        self.val_acc_best(accuracy)
        self.log("val/acc_best", self.val_acc_best.compute(), prog_bar=True, sync_dist=True)
        self.val_curve.append([self.global_step, float(accuracy)])

    def on_fit_start(self) -> None:
        self.clock.start()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["val_curve"] = self.val_curve
        checkpoint["settings"] = self.settings
        checkpoint["train_time_s"], checkpoint["samples_seen"] = self.clock.seconds(), self.samples_seen

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.val_curve = list(checkpoint.get("val_curve", []))
        self.clock.before = checkpoint.get("train_time_s", 0.0)
        self.samples_seen = checkpoint.get("samples_seen", 0)

    def on_test_epoch_start(self) -> None:
        datamodule = self.trainer.datamodule
        self.test_split_names = datamodule.test_splits() if hasattr(datamodule, "test_splits") else ["test"]
        self.test_accs = nn.ModuleDict(
            {split: MulticlassAccuracy(self.num_classes, average="micro") for split in self.test_split_names}
        ).to(self.device)
        self.test_predictions = {split: {"pred": [], "label": []} for split in self.test_split_names}

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        split = self.test_split_names[dataloader_idx]
        logits, _ = self(batch["input_ids"], batch["mask"])
        accuracy = self.test_accs[split]
        accuracy(logits, batch["label"])
        self.log(f"{split}/acc", accuracy, sync_dist=True, batch_size=len(batch["label"]), add_dataloader_idx=False)
        self.test_predictions[split]["pred"].append(logits.argmax(-1))
        self.test_predictions[split]["label"].append(batch["label"])

    def configure_optimizers(self) -> dict:
        return optimizers_per_step(self.optimizer_factory, self.scheduler_factory, self.parameters())


def optimizers_per_step(optimizer: Callable[..., torch.optim.Optimizer],
                        scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler] | None, params) -> dict:
    """``configure_optimizers``' answer: the optimizer over ``params`` and, if any, its schedule stepped every step.
    On CUDA parameters the optimizer is the fused one (:func:`fused_option`)."""
    params = list(params)
    built = optimizer(params=params, **fused_option(optimizer, {p.device for p in params}))
    if scheduler is None:
        return {"optimizer": built}
    return {"optimizer": built, "lr_scheduler": {"scheduler": scheduler(optimizer=built), "interval": "step"}}


def fused_option(optimizer: Callable[..., torch.optim.Optimizer], devices: set[torch.device]) -> dict:
    """``{"fused": True}`` where every parameter is on CUDA (``devices``) and ``optimizer`` (a class, or the
    ``functools.partial`` of ``configs/optimizer/*.yaml``) takes ``fused`` (AdamW, Adam, SGD): one kernel launch
    for the whole step, where the default (``foreach``) takes a few per parameter group and dtype. Else ``{}``:
    the default, and on CPU the default is what runs. A config that sets ``fused`` or ``foreach`` itself is
    left as it is (``+optimizer.fused=false`` restores the default on a GPU)."""
    import inspect

    keywords = getattr(optimizer, "keywords", {}) or {}
    if "fused" in keywords or keywords.get("foreach") or not devices or any(d.type != "cuda" for d in devices):
        return {}
    try:
        takes = "fused" in inspect.signature(getattr(optimizer, "func", optimizer)).parameters
    except (TypeError, ValueError):  # no signature to read: leave it be
        return {}
    return {"fused": True} if takes else {}


def compile_in_place(model: nn.Module, device: torch.device, backend: str | Callable = "inductor") -> None:
    """``torch.compile`` ``model`` in place for running on ``device``: its calls run the compiled code, its parameters
    and their names stay the eager ones (as ``nn.Module.compile``). Whole-graph (``fullgraph=True``): a graph break
    is an error, not a silent return to eager code.

    * On a GPU, ``mode="reduce-overhead"``: each step's kernels are captured once in a CUDA graph and replayed, one
      launch for the whole network instead of one per kernel; with static shapes (``dynamic=False``: one graph per
      batch shape; ``lra.train`` pads batches, ``task.pad_multiple``).
    * On CPU, Inductor draws random numbers with ATen's generator (``fallback_random``): its own CPU generator was
      slower than eager there (docs/bench.md, "Compiling"), and so a compiled step's dropout masks are the eager
      step's.

    Autocast (``trainer.precision=bf16-mixed``) is entered inside the compiled code, with the caller's setting:
    compiled from outside it, the backward of an autograd Function run under ``autocast_off`` (the pseudo-inverse)
    is traced with autocast on, and mixes bf16 and float32 operands. ``backend``: Inductor (training), or another
    ``torch.compile`` backend (``lra.bench.compile_check``'s tests; the mode and options above are Inductor's).

    First every submodule with a ``before_compile(device)`` method is called with ``device``: what compiled code
    cannot do, e.g. :meth:`attention.l1.L1Attention.before_compile`'s warning (Dynamo does not trace
    ``warnings.warn``)."""
    for module in model.modules():
        prepare = getattr(module, "before_compile", None)
        if callable(prepare):
            prepare(device)
    options = {}
    if backend == "inductor":
        options = dict(mode="reduce-overhead", dynamic=False) if device.type == "cuda" else dict(
            options={"fallback_random": True})

    def under_autocast(enabled: bool, dtype: torch.dtype, *args, **kwargs):
        with torch.autocast(device.type, dtype=dtype, enabled=enabled):
            return model._call_impl(*args, **kwargs)

    compiled = torch.compile(under_autocast, fullgraph=True, backend=backend, **options)

    def call(*args, **kwargs):
        enabled, dtype = torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type)
        with torch.autocast(device.type, enabled=False):
            return compiled(enabled, dtype, *args, **kwargs)

    model._compiled_call_impl = call  # what nn.Module.compile sets: __call__ runs it instead of the eager call
