"""Shared fixtures: compose the real Hydra config, run the real CLI (in a process, or in this one), tiny generated
ListOps data."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import random
import signal
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

from attention import impl as attention_impl
from lra import REPO_ROOT
from lra.tasks import listops_generator

CONFIG_DIR = str(REPO_ROOT / "configs")


def pytest_report_header(config) -> str:
    """Which ATen kernels ran (ATEN_CPU_CAPABILITY picks them; ``make test-numerics ISA=...``)."""
    return f"torch {torch.__version__}, ATen CPU capability {torch.backends.cpu.get_cpu_capability()}"


def compose_config(overrides: list[str], output_dir: Path | str | None = None) -> DictConfig:
    """``configs/train.yaml`` composed with ``overrides``; ``paths.output_dir`` set (no Hydra runtime here)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    if output_dir is not None:
        with open_dict(cfg):
            cfg.paths.output_dir = str(output_dir)
    return cfg


@pytest.fixture(params=["cpu_forms", "fused_forms"])
def landmark_forms(request, monkeypatch) -> str:
    """Runs a test on the CPU forms of the landmark attention (``attention.impl=cpu``), then on the fused forms that
    other devices run (``attention.impl=fused``), both against the same references: what ``auto`` picks for CUR and
    Nyström on CPU tensors (:data:`attention.impl.AUTO`) is that form for the test, so modules built without a key
    and the functions called without ``forms`` run it too."""
    impl = "fused" if request.param == "fused_forms" else "cpu"
    for family in ("cur", "nystrom"):
        monkeypatch.setitem(attention_impl.AUTO[family], "cpu", (impl, "the test's form"))
    return request.param


def auto_picks(monkeypatch, family: str, impl: str) -> None:
    """Within a test, ``attention.impl=auto`` runs ``impl`` for ``family`` on CPU tensors (:data:`attention.impl.AUTO`),
    and scores built directly run their C++ kernels only in the ``cpu`` form (as :func:`attention.impl.configure`
    sets them for a built variant)."""
    from attention.scores import KERNEL_SCORES

    monkeypatch.setitem(attention_impl.AUTO[family], "cpu", (impl, "the test's form"))
    for score in KERNEL_SCORES:
        monkeypatch.setattr(score, "kernels", impl == "cpu")


def run_cli(args: list[str], cwd: Path | None = None, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python <args>`` as a user would (real Hydra, Lightning, W&B offline); stdout+stderr captured."""
    # One thread: tiny models gain nothing from more, and test processes share 2 cores.
    environment = {**os.environ, "WANDB_SILENT": "true", "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd or REPO_ROOT, capture_output=True, text=True, timeout=timeout, env=environment
    )


class Console(io.StringIO):
    """A captured console that, like a pipe to a UTF-8 terminal log, says its encoding (tqdm draws its bars by it)."""

    encoding = "utf-8"


# The commands :func:`run_in_process` runs: each module's ``main()`` is its ``python -m`` entry point.
IN_PROCESS_MODULES = ("lra.train", "lra.evaluate")


def run_in_process(args: list[str], env: dict | None = None, merge_output: bool = False) -> subprocess.CompletedProcess:
    """``python -m lra.train <args>`` (or ``lra.evaluate``) run in this process: the real entry point (``main()``: the
    command line's checks, Hydra with its callbacks and run dir, Lightning, W&B offline), without the 5-8 s a new
    Python process spends importing them. Returns what :func:`run_cli` returns: the exit code a process would have
    (0, the code of ``SystemExit``, 1 for a message or an uncaught exception, whose traceback goes to stderr) and the
    output (``merge_output``: stderr into stdout, as ``stderr=STDOUT``).

    For tests of what a run records and prints. A test about signals, the run-dir lock or a process's exit status
    keeps :func:`run_cli` (a separate process). The run gets one torch thread (run_cli's ``OMP_NUM_THREADS=1``); what
    it changes in the process (sys.argv, the signal handlers, the environment, the root logger, the loggers' levels
    and Lightning's console, warning filters, Hydra's global state and run config, torch's threads, deterministic mode
    and random generators) is put back afterwards, so the next test sees the process as before."""
    if len(args) < 2 or args[0] != "-m" or args[1] not in IN_PROCESS_MODULES:
        raise ValueError(f"run_in_process runs `-m <module> ...` for a module of {IN_PROCESS_MODULES} "
                         f"(got {args[:2]}); run_cli runs any command")
    import importlib

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    entry = importlib.import_module(args[1]).main
    out = Console()
    err = out if merge_output else Console()
    saved_env, saved_argv = dict(os.environ), sys.argv
    saved_signals = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    root = logging.getLogger()
    saved_root = list(root.handlers)
    loggers = [root, *(item for item in logging.Logger.manager.loggerDict.values() if isinstance(item, logging.Logger))]
    saved_levels = [(logger, logger.level, logger.disabled) for logger in loggers]  # a failed job leaves
    # lra.runtime.console.QuietConsole's levels set: its on_job_end does not run when the job exits
    consoles = [handler for name in ("lightning", "lightning.pytorch", "lightning.fabric")  # their handlers write
                for handler in logging.getLogger(name).handlers  # to the stderr of import time
                if type(handler) is logging.StreamHandler]
    saved_streams = [handler.stream for handler in consoles]
    for handler in consoles:
        handler.setStream(err)
    saved_torch = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                   torch.get_rng_state(), random.getstate())
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as run_cli's OMP_NUM_THREADS=1: tiny models gain nothing from more
    os.environ.update({"WANDB_SILENT": "true", **(env or {})})
    sys.argv = [args[1].replace(".", "/") + ".py", *args[2:]]
    code = 0
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                entry()
            except SystemExit as exit_:  # as the interpreter ends a process: a message goes to stderr, exit 1
                if exit_.code is None or isinstance(exit_.code, int):
                    code = exit_.code or 0
                else:
                    print(exit_.code, file=sys.stderr)
                    code = 1
            except Exception:  # noqa: BLE001 - an uncaught error ends a process with its traceback and exit 1
                traceback.print_exc()
                code = 1
    finally:
        for handler in root.handlers:  # the run's log file (Hydra's job logging), closed as at a process's exit
            if handler not in saved_root:
                handler.close()
        root.handlers[:] = saved_root
        for logger, level, disabled in saved_levels:
            logger.setLevel(level)
            logger.disabled = disabled
        for handler, stream in zip(consoles, saved_streams):
            handler.setStream(stream)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        for signum, handler in saved_signals.items():
            signal.signal(signum, handler)
        torch.set_num_threads(saved_threads)
        torch.use_deterministic_algorithms(saved_torch[0], warn_only=saved_torch[1])
        torch.set_rng_state(saved_torch[2])
        random.setstate(saved_torch[3])
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None  # lra.runtime.results.job_overrides() of a later test reads no stale run
    stderr = "" if merge_output else err.getvalue()
    return subprocess.CompletedProcess([sys.executable, *args], code, out.getvalue(), stderr)


@pytest.fixture(scope="session")
def tiny_listops(tmp_path_factory) -> Path:
    """A tiny ListOps copy in the official format (64/32/32 examples, lengths 10-60)."""
    out = tmp_path_factory.mktemp("listops")
    listops_generator.generate(out, {"train": 64, "val": 32, "test": 32}, seed=0, min_length=10, max_length=60)
    return out


@pytest.fixture
def tiny_listops_overrides(tiny_listops, tmp_path) -> list[str]:
    """Overrides that train ``listops_small`` on the tiny copy for a few steps, caching under ``tmp_path``."""
    return [
        "task=listops_small",
        f"task.data_dir={tiny_listops}",
        f"paths.cache_dir={tmp_path / 'cache'}",
        "task.batch_size=16",
        "task.warmup_steps=2",
        "trainer.max_steps=4",
        "task.eval_every=2",
        "logger=csv",
    ]


@pytest.fixture
def exact_float32_matmuls():
    """Plain float32 matmuls on a GPU (no TF32) while a test runs, like the Triton kernels' ``ieee`` dots and
    the tolerances the kernel tests assume; restored afterwards."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture
def tensor_core_dots(monkeypatch):
    """Under the interpreter, float32 ``tl.dot`` rounds as the GPU's units would for its ``input_precision``
    (:func:`tests.triton_env.hardware_dot`); Triton's interpreter itself computes every float32 dot exactly, so
    without this a kernel asking for TF32 passes tests its GPU form would fail. On CUDA the hardware does it."""
    from tests.triton_env import INTERPRETER, hardware_dot

    if not INTERPRETER:
        yield
        return
    import numpy as np
    from triton.runtime import interpreter

    exact = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.dtype != np.float32 or b.data.dtype != np.float32:
            return exact(self, a, b, d, input_precision, max_num_imprecise_acc)
        product = hardware_dot(a.data, b.data, input_precision.name)
        return interpreter.TensorHandle(product.astype(d.data.dtype) + d.data, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
    yield
