"""Every form of every attention variant against the same reference, read from ``attention.impl``'s table.

For each ``configs/attention/*.yaml`` and each form its family has (:func:`attention.impl.impls`: the single
``pytorch`` form of a variant without kernels) that runs here, the full model (``task=listops``, one layer, eval mode:
no dropout, the selection choosing 64 of 128 tokens) gives logits and parameter gradients in float32 within 1e-3 of the
same model in its ``pytorch`` form in float64. Nothing lists the variants or the forms: a new config file or a new
table row is a new case. The Triton forms run under the interpreter in one subprocess
(:func:`test_triton_forms_under_the_interpreter`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from hydra.utils import get_class

from attention import impl
from lra.build import build_model
from tests.conftest import compose_config, run_cli

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "attention"
LENGTH, BATCH = 128, 2  # above the 64 landmarks (the selections choose) and Linformer's k


def family(node) -> str | None:
    """The table family of the classes a config node names (MEGA's is that of its ``approximation``)."""
    found = [getattr(get_class(value), "impl_family", None) for key, value in _targets(node)]
    return next((name for name in found if name), None)


def _targets(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "_target_":
                yield key, value
            else:
                yield from _targets(value)


def cases() -> list:
    """``(variant, impl)`` for every config and every form of its family that runs on CPU float32 tensors here."""
    from omegaconf import OmegaConf

    found = []
    for path in sorted(CONFIGS.glob("*.yaml")):
        node = OmegaConf.to_container(compose_config([f"attention={path.stem}"]).attention)
        fam = family(node)
        # a variant without kernels has one form, whose float32-vs-float64 agreement its own test file checks against
        # a dense reference: under -m slow here
        marks = () if fam else (pytest.mark.slow,)
        found += [pytest.param(path.stem, name, marks=marks, id=f"{path.stem}-{name}")
                  for name in impl.impls(fam)[1:] if impl._runs(fam, name, "cpu", torch.float32)]
    return found


@functools.lru_cache(maxsize=1)  # the cases of one variant are consecutive: its reference is computed once
def reference(variant: str):
    """The variant's ``pytorch`` form in float64; a family without one (FlashCUR: Triton only) is compared with the
    ``pytorch`` form of the class it extends (CUR), built from the same config node."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(compose_config([f"attention={variant}"]).attention)
    if "pytorch" in impl.impls(family(node)):
        return step(variant, "pytorch", torch.float64)
    base = next(cls for cls in get_class(node["_target_"]).__mro__[1:]
                if getattr(cls, "impl_family", None) and "pytorch" in impl.impls(cls.impl_family))
    return step(variant, "pytorch", torch.float64, [f"attention._target_={base.__module__}.{base.__name__}"])


def step(variant: str, form: str, dtype: torch.dtype, overrides: tuple | list = ()):
    """Logits and parameter gradients (by name) of one eval-mode forward and backward of the variant's model."""
    cfg = compose_config(["task=listops", f"task.max_length={LENGTH}", "model.num_layers=1", f"attention={variant}",
                          f"attention.impl={form}", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg).eval().to(dtype)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, cfg.task.vocab_size, (BATCH, LENGTH), generator=generator)
    mask = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    mask[-1, LENGTH // 3:] = False
    ids[~mask] = 0
    logits, aux = model(ids, mask)
    weight = torch.randn(logits.shape, generator=generator, dtype=torch.float64).to(dtype)
    ((logits * weight).sum() + sum(aux.values(), torch.zeros((), dtype=dtype))).backward()
    return logits.detach().double(), {name: p.grad.double() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("variant, form", cases())
def test_every_form_matches_the_pytorch_form_in_float64(variant, form):
    reference_logits, reference_grads = reference(variant)
    logits, grads = step(variant, form, torch.float32)
    scale = reference_logits.abs().max().clamp_min(1)
    assert (logits - reference_logits).abs().max() <= 1e-3 * scale, f"{variant} attention.impl={form}: logits"
    assert grads.keys() == reference_grads.keys()
    for name, grad in grads.items():
        expected = reference_grads[name]
        assert (grad - expected).abs().max() <= 1e-3 * expected.abs().max().clamp_min(1e-3), f"{variant}/{form}: {name}"


@pytest.mark.process
@pytest.mark.slow  # each Triton form is checked against its reference under the interpreter by its kernel's tests
def test_triton_forms_under_the_interpreter():
    """The Triton forms (``triton`` rows) against the same reference, on CPU tensors under ``TRITON_INTERPRET=1``."""
    triton = [case for case in cases() if case.values[1] == "triton"]
    assert not triton, "no Triton form runs on CPU without the interpreter"
    proc = run_cli(["-m", "pytest", __file__, "-q", "-k", "triton and not interpreter", "-p", "no:cacheprovider"],
                   env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout


def test_a_run_records_the_form_of_every_op_and_refuses_one_that_cannot_run():
    """:func:`attention.impl.model_forms`, what ``lra.train`` prints first and writes to results.json and W&B: each op's
    form for the trainer's device; a form the variant lacks is refused at build, one that cannot run on the device
    before training, each naming the forms that can."""
    def model(*overrides):
        return build_model(compose_config(["task=listops_small", *overrides]))

    assert impl.model_forms(model("attention=curformer"), "cpu") == {
        "impl": "auto", "attention": "cpu", "pinv": "cpu", "selection": "cpu", "dropout": "cpu"}
    assert impl.model_forms(model("attention=curformer", "attention.impl=pytorch"), "meta") == {
        "impl": "pytorch", "attention": "pytorch", "pinv": "pytorch", "selection": "pytorch", "dropout": "pytorch"}
    assert impl.model_forms(model("attention=nystromformer"), "meta")["attention"] == "fused"
    assert impl.model_forms(model("attention=softmax"), "cpu") == {"impl": "auto", "attention": "pytorch",
                                                                   "dropout": "cpu"}
    with pytest.raises(ValueError, match=r"attention.impl='fused' is not a form of attention=l1: it has \['auto', 'cpu'"):
        model("attention=l1", "attention.impl=fused")
    with pytest.raises(ValueError, match=r"attention.impl=triton of L1Attention cannot run on cpu .* forms that can: "
                                         r"\['cpu', 'pytorch'\]"):
        impl.model_forms(model("attention=l1", "attention.impl=triton"), "cpu")
    with pytest.raises(ValueError, match=r"attention.impl=cpu of CURAttention cannot run on cuda"):
        impl.model_forms(model("attention=curformer", "attention.impl=cpu"), "cuda")
