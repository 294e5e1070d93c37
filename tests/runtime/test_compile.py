"""``model.compile=true``: compiled training matches eager, checkpoints keep the eager keys, the graph-break
lister and the GPU check's compile steps.

Inductor compiles each graph to C++ with the system compiler (measured on 2 quiet cores: ~20 s for a one-layer
softmax network, ~60 s for CUR at two lengths with a warm cache, ~2 min cold), so the default suite compiles one small
one-layer network with Inductor (softmax, dropout on) and traces CUR at two lengths with AOT autograd; Inductor on
CUR and the other variants is ``slow``.
"""

from __future__ import annotations

import csv
import json

import pytest
import torch
from hydra.errors import InstantiationException

from attention.impl import model_forms
from lra import REPO_ROOT
from lra.bench import compile_check, gpu_check
from lra.bench.__main__ import main as bench
from lra.build import build_datamodule, build_model, build_module
from lra.module import compile_in_place
from lra.tasks.base import collate
from lra.runtime.results import config_differences
from lra.runtime.run_dir import settings_differences
from tests.conftest import compose_config, run_cli

INDUCTOR_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}  # no pool of compile workers on a 2-core machine


@pytest.fixture
def one_compile_thread():
    import torch._inductor.config

    with torch._inductor.config.patch(compile_threads=1):
        yield
    torch._dynamo.reset()  # drop the compiled graphs


ATTENTION_CONFIGS = sorted(path.stem for path in (REPO_ROOT / "configs" / "attention").glob("*.yaml"))


def small(attention: str, *overrides: str):
    """A one-layer network of ``attention`` on listops_small; a variant with landmarks gets m = 8 < n, so it
    approximates."""
    base = ["task=listops_small", f"attention={attention}", "model.num_layers=1"]
    landmarks = ["attention.num_landmarks=8"] if "num_landmarks" in compose_config(base).attention else []
    return compose_config([*base, *landmarks, *overrides])


@pytest.mark.compile
@pytest.mark.parametrize("attention, lengths, backend", [
    # Inductor on CPU compiles each fused kernel with the system compiler: ~2 min for CUR from a cold cache, so the
    # default suite traces CUR at two lengths with AOT autograd (its graphs, functionalisation, dynamic shapes, no
    # code generation) and Inductor's own code runs in the dropout-mask test below (softmax); both here are slow.
    pytest.param("softmax", (48,), "inductor", marks=pytest.mark.slow),
    pytest.param("curformer", (48, 40), "inductor", marks=pytest.mark.slow),
    ("curformer", (48, 40), "aot_eager"),
])
def test_compiled_training_step_matches_eager(attention, lengths, backend, one_compile_thread):
    """Softmax at one length; CUR at two, the second recompiled with dynamic shapes as training's second batch
    is (its in-place masked softmax failed there inside PyTorch before compiled code took the out-of-place form)."""
    result = compile_check.compare(small(attention), torch.device("cpu"), lengths=lengths, backend=backend)
    assert result["tensors"] > 10  # logits, loss and every gradient
    assert result["graphs"] == len(lengths)  # compiled (not run eagerly), once per shape: static, then dynamic
    assert max(result["logits"], result["loss"], result["grads"]) <= compile_check.TOLERANCE, result


@pytest.mark.slow
@pytest.mark.parametrize("attention", [name for name in ATTENTION_CONFIGS if name not in ("softmax", "curformer")])
def test_compiled_training_step_matches_eager_other_variants(attention, one_compile_thread):
    """Every other configs/attention/*.yaml, as it is added; one that cannot run on this CPU (FlashCUR's Triton
    kernels without TRITON_INTERPRET) is skipped with its refusal (at build or by attention.impl) as the reason."""
    try:
        model_forms(build_model(small(attention)), "cpu")
    except (ValueError, RuntimeError) as refusal:
        pytest.skip(str(refusal))
    result = compile_check.compare(small(attention), torch.device("cpu"), lengths=(48, 40, 44))
    assert max(result["logits"], result["loss"], result["grads"]) <= compile_check.TOLERANCE, result


def dropout_step(model, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and the flattened gradients of one training step (dropout on) from ``seed``."""
    ids = torch.randint(2, 17, (2, 48), generator=torch.Generator().manual_seed(1))  # real ListOps tokens
    mask = torch.ones(2, 48, dtype=torch.bool)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    logits, aux_losses = model(ids, mask)
    (torch.nn.functional.cross_entropy(logits, torch.tensor([1, 2])) + sum(aux_losses.values())).backward()
    return logits.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def dropout_model() -> torch.nn.Module:
    """Softmax's network with its SDPA dropout off: the masks at stake are the blocks' (:mod:`models.dropout`), and
    its graph compiles in a third of CUR's time."""
    torch.manual_seed(0)
    return build_model(small("softmax", "model.dropout=0.3", "attention.dropout=0.0")).train()


@pytest.mark.compile
def test_compiled_training_on_cpu_draws_the_eager_dropout_masks(one_compile_thread):
    """On CPU ``compile_in_place`` has Inductor draw with ATen's generator, so a compiled step with dropout on
    gives the eager step's logits and gradients from the same seed (the next test shows that Inductor's own
    generator would not)."""
    model = dropout_model()
    eager_logits, eager_grads = dropout_step(model, seed=5)
    compile_in_place(model, torch.device("cpu"))
    logits, grads = dropout_step(model, seed=5)
    assert torch.allclose(logits, eager_logits, rtol=0, atol=compile_check.TOLERANCE * eager_logits.abs().max())
    assert torch.allclose(grads, eager_grads, rtol=0, atol=compile_check.TOLERANCE * eager_grads.abs().max())
    assert not torch.equal(dropout_step(model, seed=6)[0], logits)  # dropout is on: another seed, other masks


@pytest.mark.slow  # a second Inductor compile (~20 s on 2 cores) for the control of the test above
@pytest.mark.compile
def test_inductors_own_generator_draws_other_dropout_masks(one_compile_thread):
    """The control of the test above: ``nn.Module.compile()`` without ``compile_in_place``'s options draws with
    Inductor's own generator, so the same seed gives other masks and other logits."""
    model = dropout_model()
    eager_logits, _ = dropout_step(model, seed=5)
    model.compile()
    own_logits, _ = dropout_step(model, seed=5)
    assert (own_logits - eager_logits).abs().max() > 100 * compile_check.TOLERANCE * eager_logits.abs().max()


def test_the_comparison_sees_a_compiler_that_changes_results():
    """A backend that scales every output of the graph by 1.001 fails the check; the eager backend passes
    bit for bit (dynamo only, no Inductor: seconds)."""

    def scaled(graph, example_inputs):
        def run(*args):
            outs = graph(*args)
            return type(outs)(out * 1.001 if torch.is_tensor(out) and out.is_floating_point() else out for out in outs)
        return run

    cfg = small("softmax")
    exact = compile_check.compare(cfg, torch.device("cpu"), lengths=(48,), backend="eager")
    assert exact["logits"] == exact["loss"] == exact["grads"] == 0.0 and exact["graphs"] == 1
    off = compile_check.compare(cfg, torch.device("cpu"), lengths=(48,), backend=scaled)
    assert off["logits"] > 100 * compile_check.TOLERANCE and off["grads"] > 100 * compile_check.TOLERANCE
    torch._dynamo.reset()


def test_without_dropout_zeroes_every_dropout_key():
    cfg = compile_check.without_dropout(compose_config(["attention=mega"]))
    assert cfg.model.dropout == cfg.model.block.hidden_dropout == cfg.model.block.attention_dropout == 0.0
    assert compile_check.without_dropout(compose_config(["attention=softmax"])).attention.dropout == 0.0


@pytest.mark.parametrize("value", ["yes", "1", "null"])
def test_model_compile_must_be_a_bool(value):
    with pytest.raises(ValueError, match=r"model.compile must be true or false .*model.compile=true"):
        build_module(compose_config([f"model.compile={value}"]))


def test_compiled_module_keeps_the_eager_state_dict_keys():
    """Compiling in place (configure_model) leaves parameter names alone: a compiled module's state dict
    loads strictly into an eager one and back (no ``_orig_mod.``); no compilation runs (it is lazy)."""
    eager = build_module(compose_config(["model.compile=false"]))
    compiled = build_module(compose_config(["model.compile=true"]))
    assert (eager.compile_network, compiled.compile_network) == (False, True)
    eager.configure_model()
    compiled.configure_model()
    first = compiled.model._compiled_call_impl
    compiled.configure_model()  # Lightning calls it at fit, validate and test: compiled once
    assert eager.model._compiled_call_impl is None and callable(first)
    assert compiled.model._compiled_call_impl is first
    state = compiled.state_dict()
    assert not [key for key in state if "_orig_mod" in key]
    assert list(state) == list(eager.state_dict())
    eager.load_state_dict(state, strict=True)
    compiled.load_state_dict(eager.state_dict(), strict=True)


def test_runs_recorded_before_model_compile_still_resume_and_still_count_as_done():
    """A recorded config without ``model.compile`` (runs started before the key) is the same run as one with
    ``model.compile: false``, both for resuming and for "already completed"; one with compile on is not."""
    recorded = {"seed": 0, "model": {"d_model": 64}}
    eager, compiled = ({"seed": 0, "model": {"d_model": 64, "compile": flag}} for flag in (False, True))
    assert settings_differences(recorded, eager) == []
    assert settings_differences(recorded, compiled) == [("model.compile", False, True)]
    assert config_differences(recorded, eager) == []
    assert config_differences(recorded, compiled) == ["model.compile: False -> True"]


@pytest.mark.process
@pytest.mark.slow  # ~45 s on 2 cores (two trainings, one compiled): the default suite had reached its 15-min budget
def test_train_with_compile_and_its_checkpoint_without(tiny_listops_overrides, tmp_path):
    """``lra.train ... model.compile=true`` trains, evaluates and tests through Inductor (its cache fills with
    compiled kernels); the checkpoint has the eager keys and loads into a module compiled or not."""
    run_dir, cache = tmp_path / "run", tmp_path / "inductor"
    overrides = [*tiny_listops_overrides, "model.num_layers=1", "task.batch_size=32", "trainer.max_steps=1",
                 "task.eval_every=1"]
    proc = run_cli(["-m", "lra.train", *overrides, "model.compile=true", f"hydra.run.dir={run_dir}"],
                   env={**INDUCTOR_ENV, "TORCHINDUCTOR_CACHE_DIR": str(cache)}, timeout=1800)  # ~1 min on 2 idle cores
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[lra] model.compile=true" in proc.stdout
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 1 and results["config"]["model"]["compile"] is True
    assert list(cache.rglob("*.so")), "Inductor compiled nothing"
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert state and not [key for key in state if "_orig_mod" in key]
    for compiled in (False, True):
        module = build_module(compose_config([*overrides, f"model.compile={str(compiled).lower()}"]))
        module.configure_model()
        module.load_state_dict(state, strict=True)
        assert torch.equal(module.model.token_embedding.weight, state["model.token_embedding.weight"])


@pytest.mark.compile
def test_every_variant_traces_as_one_graph_without_a_break(tmp_path, capsys):
    """``lra.bench compile_breaks``: every variant's network is one graph with no break on CPU (L1's ctypes kernels
    step aside under torch.compile), as ``model.compile=true`` (``fullgraph=True``) requires; FlashCUR without
    CUDA is skipped with the reason, not left out."""
    # n 160: every variant's default settings fit (Linformer refuses k = 128 > n), as in test_device_hygiene
    bench(["compile_breaks", "--variant-overrides", "--n", "160", "--device", "cpu", "--out", str(tmp_path)])
    with (tmp_path / "compile_breaks.csv").open() as handle:
        rows = {row["variant"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {path.stem for path in (REPO_ROOT / "configs" / "attention").glob("*.yaml")}
    for name, row in rows.items():
        if name == "flashcur" and not torch.cuda.is_available():
            assert row["status"] == "skipped" and "CUDA" in row["reason"]
            continue
        assert (row["status"], row["graphs"], row["graph_breaks"], row["breaks"]) == ("ok", "1", "0", ""), row
    assert "breaks:" not in capsys.readouterr().out


@pytest.mark.compile
@pytest.mark.usefixtures("landmark_forms")
@pytest.mark.parametrize("attention", ["curformer", "l1_cur", "nystromformer", "megacur"])
def test_landmark_variants_compile_whole_and_train_under_bf16_autocast(attention):
    """``model.compile=true trainer.precision=bf16-mixed``: the step compiles as one graph and its backward runs,
    in the CPU forms and in the fused forms GPUs run. Compiled from outside autocast, the backward of the
    pseudo-inverse's autograd Function was traced with autocast on and mixed bf16 with float32 operands
    (``Input dtypes must be the same``); ``compile_in_place`` enters autocast inside the compiled code.
    AOT autograd without Inductor (``aot_eager``): forward and backward traced, in seconds."""
    torch._dynamo.reset()
    cfg = small(attention)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    compile_in_place(model, torch.device("cpu"), backend="aot_eager")
    ids, mask, labels = compile_check.batch_of(cfg, 3, 48, torch.device("cpu"), seed=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, aux_losses = model(ids, mask)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels) + sum(aux_losses.values())
    loss.backward()
    torch._dynamo.reset()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert torch.isfinite(loss) and grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.process
@pytest.mark.slow  # Inductor compiles every variant (~1-2 min each on 2 cores)
@pytest.mark.parametrize("attention", sorted(path.stem for path in (REPO_ROOT / "configs" / "attention").glob("*.yaml")
                                             if path.stem != "flashcur"))
def test_every_variant_trains_compiled_with_bf16_mixed(attention, tiny_listops_overrides, tmp_path):
    """``lra.train model.compile=true trainer.precision=bf16-mixed`` trains and tests every variant (FlashCUR needs
    CUDA): the command of the bf16 crash, through Inductor."""
    run_dir = tmp_path / "run"
    landmarks = ["attention.num_landmarks=8"] if attention in ("curformer", "l1_cur", "nystromformer", "megacur") else []
    overrides = [*tiny_listops_overrides, f"attention={attention}", *landmarks, "model.num_layers=1",
                 "task.batch_size=8", "trainer.max_steps=2", "task.eval_every=2", "+trainer.limit_val_batches=1",
                 "+trainer.limit_test_batches=1", "model.compile=true", "trainer.precision=bf16-mixed",
                 f"hydra.run.dir={run_dir}"]
    proc = run_cli(["-m", "lra.train", *overrides], env={**INDUCTOR_ENV, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")},
                   timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 2


def test_pad_multiple_rounds_batch_lengths_up_to_few_shapes():
    """``task.pad_multiple``: a batch's length rounded up to a multiple of it, never past the stored length; the key
    mask still marks the real tokens only."""
    stored = 50  # task.max_length: the width the ids are stored at
    items = [(torch.arange(1, stored + 1, dtype=torch.int16), torch.tensor(length), torch.tensor(0)) for length in (7, 13)]
    assert collate(items)["input_ids"].shape == (2, 13)
    batch = collate(items, pad_multiple=16)
    assert batch["input_ids"].shape == (2, 16) and batch["mask"].sum(-1).tolist() == [7, 13]
    long_items = [(torch.ones(stored, dtype=torch.int16), torch.tensor(49), torch.tensor(0))]
    assert collate(long_items, pad_multiple=16)["input_ids"].shape == (1, stored)  # 64 > 50: the stored length
    assert collate(items, pad_multiple=stored)["input_ids"].shape == (2, stored)
    with pytest.raises(InstantiationException, match="task.pad_multiple must be null or an integer >= 1"):
        build_datamodule(compose_config(["task=listops_small", "task.pad_multiple=0"]))


@pytest.mark.parametrize("overrides, expected", [
    (["trainer=gpu", "model.compile=true"], 200),  # CUDA graphs: one batch shape, task.max_length
    (["trainer=gpu", "model.compile=true", "task.pad_multiple=64", "task.group_by_length=true"], 64),
    (["trainer=gpu"], None),  # eager on a GPU: batches trimmed to their longest sequence
    (["model.compile=true"], None),  # compiled on CPU: dynamic shapes, no graphs
])
def test_compiled_gpu_runs_pad_batches_for_cuda_graphs(overrides, expected):
    """``model.compile=true`` on a GPU captures a CUDA graph per batch shape: ``lra.train``'s datamodule pads batches
    to ``task.max_length`` unless ``task.pad_multiple`` is set (checked without a GPU: the configs only)."""
    datamodule = build_datamodule(compose_config(["task=listops_small", *overrides]))
    assert datamodule.pad_multiple == expected


@pytest.mark.process  # the meta step runs pytest in a process of its own
def test_gpu_check_runs_the_meta_check_and_compiled_training(tmp_path):
    args = gpu_check.parse_args(["--out", str(tmp_path), "--variants", "softmax", "curformer", "mega",
                                 "--compile-steps", "5"])
    steps = gpu_check.plan(args)
    assert [s.name for s in steps][:6] == ["kernels", "meta", "compile", "compile", "compile", "compile"]
    meta, check, breaks, *trains = [s for s in steps if s.name in ("meta", "compile")]
    assert meta.command[-1] == "tests/runtime/test_device_hygiene.py" and check.command is None
    assert breaks.command[2:4] == ["lra.bench", "compile_breaks"] and "cuda" in breaks.command
    assert [next(a for a in s.command if a.startswith("attention=")) for s in trains] == [
        "attention=softmax", "attention=curformer"]
    assert all({"model.compile=true", "trainer=gpu", "trainer.max_steps=5"} <= set(s.command) for s in trains)
    meta.command += ["-k", "test_variant_trains_on_meta_without_host_sync and softmax"]  # the command runs here too
    gpu_check.run_step(meta)
    assert meta.status == "ok", "\n".join(meta.details)


def test_gpu_check_compile_rows_and_failures(monkeypatch):
    """The in-process compile step: one row per variant; a variant beyond the tolerance or failing fails the
    step at the end, naming it, and the others still run."""
    results = {"softmax": 2e-7, "curformer": 3e-5}

    def compare(cfg, device, lengths):
        if cfg.attention.name == "mega":
            raise RuntimeError("no C++ compiler")
        error = results[cfg.attention.name]
        return {"logits": error, "loss": error, "grads": error, "worst": "grad/head.weight", "tensors": 20, "graphs": 1,
                "compile_s": 1.0}

    monkeypatch.setattr(compile_check, "compare", compare)
    assert gpu_check.compile_checks(["softmax"])[2].startswith("| softmax | 2.0e-07 |")
    step = gpu_check.Step("compile", "compiled vs eager")
    gpu_check.run_step(step, ["softmax", "curformer", "mega"])
    assert step.status == "failed (AssertionError)"
    assert "for: curformer, mega" in step.details[0] and "| mega | failed: RuntimeError: no C++ compiler" in "\n".join(step.details)


def test_autocast_off_compiles_without_the_availability_query(monkeypatch):
    """torch 2.11's Dynamo cannot trace ``torch.amp.is_autocast_available`` (a graph break per float32 region on
    CUDA, seen on an H200): under torch.compile :func:`autocast_off` must not ask it. An untraceable stand-in
    fails a full-graph compile wherever it is called."""
    from kernels.common.precision import autocast_off

    asked = []

    def untraceable(device_type: str) -> bool:
        asked.append(device_type)
        return True

    monkeypatch.setattr(torch.amp, "is_autocast_available", torch._dynamo.disable(untraceable))

    def double(x):
        with autocast_off(x.device.type):
            return x * 2

    torch._dynamo.reset()
    out = torch.compile(double, fullgraph=True, backend="eager")(torch.ones(3))
    torch._dynamo.reset()
    assert asked == [] and torch.equal(out, torch.full((3,), 2.0))
    assert autocast_off("cpu") is not None and asked == ["cpu"]  # eager still asks (meta has no autocast)


def test_l1_dropout_warning_stays_out_of_compiled_code():
    """Dynamo cannot trace ``warnings.warn`` ("Attempted to call function marked as skipped", torch 2.11 on CUDA at
    L1's CUDA-with-dropout warning): the warning is given in eager code only, and a compiled run gets it from
    ``compile_in_place`` before compiling (``L1Attention.before_compile``) for CUDA with dropout on, not for CPU or
    without dropout. The L1 module in training with dropout compiles as one graph (``fullgraph=True``)."""
    import warnings

    from attention import l1

    def warns_then_doubles(x):
        l1.warn_unfused_training()
        return 2 * x

    with pytest.warns(UserWarning, match="FlashL1 has no attention dropout"):
        warns_then_doubles(torch.ones(2))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="L1 attention")  # compiled code gives no such warning
        torch._dynamo.reset()
        assert torch.equal(torch.compile(warns_then_doubles, fullgraph=True, backend="eager")(torch.ones(2)),
                           torch.full((2,), 2.0))
        module = l1.L1Attention(num_heads=2, head_dim=4, dropout=0.1).train()
        q, k, v = torch.randn(3, 1, 2, 6, 4).unbind(0)
        out = torch.compile(module, fullgraph=True, backend="eager")(q, k, v, torch.ones(1, 6, dtype=torch.bool))
        assert out.shape == v.shape
        torch._dynamo.reset()
        model = build_model(small("l1"))
        compile_in_place(model, torch.device("cpu"), backend="eager")  # CPU: the fused kernel's absence is moot
        compile_in_place(build_model(small("l1", "attention.dropout=0.0")), torch.device("cuda"), backend="eager")
    with pytest.warns(UserWarning, match="set attention.dropout=0 to train with the fused kernel"):
        compile_in_place(build_model(small("l1")), torch.device("cuda"), backend="eager")  # lazy: nothing runs here
