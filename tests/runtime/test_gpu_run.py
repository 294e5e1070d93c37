"""A GPU training run is fast and quiet by default, checked without a GPU: DataLoader workers for ``trainer=gpu``
(none for ``trainer=cpu``), TF32 float32 products for a GPU run (:mod:`lra.runtime.gpu_setup`), the fused AdamW on CUDA
parameters (:func:`lra.module.fused_option`)."""

from __future__ import annotations

import functools

import pytest
import torch
from hydra.utils import instantiate

from lra.runtime.gpu_setup import fast_float32_matmuls, runs_on_gpu, setup_gpu_run
from lra.module import fused_option, optimizers_per_step
from tests.conftest import compose_config

CUDA = {torch.device("cuda", 0)}


@pytest.fixture
def restore_matmul_precision():
    saved = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(saved)


@pytest.mark.parametrize("overrides, workers", [
    (["trainer=gpu"], 4), (["trainer=ddp"], 4), (["trainer=cpu"], 0), (["trainer=ddp_cpu"], 0),
    (["trainer=gpu", "task=text"], 4), (["trainer=gpu", "task.datamodule.num_workers=2"], 2),
    (["trainer=gpu", "task.datamodule.num_workers=0"], 0),
])
def test_gpu_trainers_give_the_task_dataloader_workers(overrides, workers):
    """configs/trainer/loader/gpu.yaml sets ``task.datamodule.num_workers`` for the GPU trainers (enough that
    Lightning's "does not have many workers" hint, below 2, stays silent); the CPU trainers keep the tasks' 0, and a
    command-line value wins. The trainer node itself gains no key (it is ``lightning.Trainer``'s arguments)."""
    cfg = compose_config(overrides)
    assert cfg.task.datamodule.num_workers == workers
    assert "num_workers" not in cfg.trainer and "loader" not in cfg.trainer and "task" not in cfg.trainer
    assert runs_on_gpu(cfg) == (cfg.trainer.accelerator == "gpu")


def test_float32_products_use_tf32_on_a_gpu_run_only(restore_matmul_precision):
    torch.set_float32_matmul_precision("highest")
    assert not fast_float32_matmuls("cpu") and torch.get_float32_matmul_precision() == "highest"
    setup_gpu_run(compose_config(["trainer=cpu"]))
    assert torch.get_float32_matmul_precision() == "highest"
    setup_gpu_run(compose_config(["trainer=gpu"]))
    assert torch.get_float32_matmul_precision() == "high"  # no Lightning/Inductor TF32 hint on a GPU
    torch.set_float32_matmul_precision("highest")
    assert fast_float32_matmuls("cuda") and torch.get_float32_matmul_precision() == "high"


def test_adamw_of_the_config_is_fused_on_cuda_parameters_only():
    """The configured AdamW (``configs/optimizer/adamw.yaml``, a ``functools.partial``) gets ``fused=True`` for
    parameters on CUDA and the default elsewhere; a config that chooses ``fused`` or ``foreach`` keeps its choice,
    and an optimizer without a ``fused`` argument gets none."""
    adamw = instantiate(compose_config([]).optimizer)
    assert isinstance(adamw, functools.partial) and adamw.func is torch.optim.AdamW
    assert fused_option(adamw, CUDA) == {"fused": True}
    assert fused_option(adamw, {torch.device("cpu")}) == {}
    assert fused_option(adamw, CUDA | {torch.device("cpu")}) == {}
    assert fused_option(adamw, set()) == {}
    assert fused_option(instantiate(compose_config(["+optimizer.fused=false"]).optimizer), CUDA) == {}
    assert fused_option(instantiate(compose_config(["+optimizer.foreach=true"]).optimizer), CUDA) == {}
    assert fused_option(functools.partial(torch.optim.LBFGS, lr=1.0), CUDA) == {}
    assert fused_option(torch.optim.AdamW, CUDA) == {"fused": True}


def test_the_optimizer_of_cpu_parameters_keeps_torch_defaults():
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.zeros(2))]
    built = optimizers_per_step(instantiate(compose_config([]).optimizer), None, iter(params))["optimizer"]
    assert isinstance(built, torch.optim.AdamW) and built.defaults["fused"] is None
    assert [p for group in built.param_groups for p in group["params"]] == params  # a generator is taken whole
