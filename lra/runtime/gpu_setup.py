"""What a GPU training run sets before it builds anything, so that it is fast and its console quiet.

``lra.train`` calls :func:`setup_gpu_run` with the run's config. For a run on a GPU (``trainer.accelerator`` gpu or
cuda, :func:`runs_on_gpu`: ``trainer=gpu``, ``trainer=ddp``):

* float32 matrix products may use TF32 tensor cores (:func:`fast_float32_matmuls`,
  ``torch.set_float32_matmul_precision("high")``). Under ``bf16-mixed`` the model's products are bf16 anyway; what
  it changes is the float32 regions (``kernels.common.precision.autocast_off``: CUR/Nyström matrices, the PyTorch
  form of the pseudo-inverse; the fused pseudo-inverse kernels keep IEEE float32 dots) and ``32-true`` runs.
  Measured on CPU with TF32 rounding simulated: the PyTorch pseudo-inverse of softmax landmark blocks (m 32/64,
  6 steps) moves by 0.1 % (relative norm), its residual ‖AZA − A‖ by under 0.05 %. FlashCUR's and FlashL1's
  launches read the same flag (``torch.backends.cuda.matmul.allow_tf32``): their float32-operand dots then run in
  TF32 too. Lightning's "You are using a CUDA device that has Tensor Cores" hint and Inductor's "TensorFloat32
  tensor cores … available but not enabled" warning have nothing left to say. Set through the legacy API, the one
  Lightning and ``kernels.*.launch`` read: mixing it with the ``fp32_precision`` API warns. The training benchmark's
  worker (:mod:`lra.bench.train_worker`) sets the same, to time what training runs.
* DataLoader workers come from the config: ``configs/trainer/loader/gpu.yaml`` sets
  ``task.datamodule.num_workers: 4`` for ``trainer=gpu`` and ``trainer=ddp`` (``trainer=cpu`` keeps the tasks' 0),
  so Lightning's "does not have many workers" hint (under 2 workers) is not printed either.

CPU runs are left as they are.
"""

from __future__ import annotations

import torch

GPU_ACCELERATORS = ("gpu", "cuda")


def runs_on_gpu(cfg) -> bool:
    """Whether the run's trainer (``cfg.trainer.accelerator``) is a GPU one."""
    return cfg.trainer.get("accelerator") in GPU_ACCELERATORS


def fast_float32_matmuls(device_type: str) -> bool:
    """For ``device_type`` "cuda": ``torch.set_float32_matmul_precision("high")`` (TF32 tensor cores for float32
    products) and True; anything else: nothing, False."""
    if device_type != "cuda":
        return False
    torch.set_float32_matmul_precision("high")
    return True


def setup_gpu_run(cfg) -> None:
    """The settings of a GPU run (module docstring) for ``cfg``; nothing for a CPU run."""
    fast_float32_matmuls("cuda" if runs_on_gpu(cfg) else "cpu")
