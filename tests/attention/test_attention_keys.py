"""Config keys users type, through composed configs and the real objects: one landmark key
(``attention.num_landmarks``) and one pseudo-inverse start key (``attention.pinv_init``) for every CUR/Nyström
variant, ``attention.linear=<name>`` (a value override) refused with the group-override fix, and a key a variant's
constructor does not take (a typo) refused naming the keys it does."""

from __future__ import annotations

import re

import pytest
import torch
from hydra.errors import ConfigCompositionException

from attention.linear import DeltaRuleAttention
from lra import REPO_ROOT
from lra.build import attention_factory, build_attention, build_model
from tests.attention_reference import assert_padding_invariant, dense_softmax_weights, padded_mask, random_qkv
from tests.tolerances import tolerance
from tests.conftest import compose_config

PINV_VARIANTS = ["nystromformer", "curformer", "l1_cur", "megacur"]  # + flashcur (GPU / interpreter; compose only)

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every built attention variant of the model (``blocks[i].attn.attend`` or MEGA's ``blocks[i].attend``)."""
    return [module for name, module in model.named_modules() if name.endswith("attend")]


def build(name: str, overrides: list[str]) -> torch.nn.Module:
    """The attention node of ``attention=<name>`` built for 2 heads of 8 (MEGA: 1 head, z_dim 8)."""
    cfg = compose_config([f"attention={name}", "task.max_length=64", *overrides])
    torch.manual_seed(0)  # MEGA's relative-bias table is random: the same for every build
    return build_attention(cfg.attention, 1 if name.startswith("mega") else 2, 8)


# --- attention.num_landmarks ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", PINV_VARIANTS)
def test_num_landmarks_is_one_key_path(name):
    model = build_model(compose_config([f"attention={name}", "attention.num_landmarks=7"]))
    landmarks = [getattr(module, "approximation", module).num_landmarks for module in attention_modules(model)]
    assert landmarks == [7] * len(model.blocks)


def test_flashcur_composes_with_the_same_keys():
    cfg = compose_config(["attention=flashcur", "attention.num_landmarks=32", "attention.pinv_init=global"])
    assert (cfg.attention.num_landmarks, cfg.attention.pinv_init) == (32, "global")


def test_megacur_landmark_key_decides_exactness():
    """MEGA weights in MegaCUR: ``attention.num_landmarks`` ≥ n reproduces MEGA, a smaller one approximates it."""
    torch.manual_seed(0)
    mega = build_model(compose_config(["attention=mega"])).eval()
    ids = torch.randint(1, 17, (2, 40))
    key_mask = padded_mask(2, 40, [40, 25])

    def megacur(landmarks: int) -> torch.Tensor:
        model = build_model(compose_config(["attention=megacur", f"attention.num_landmarks={landmarks}",
                                            "attention.pinv_iters=30"])).eval()
        model.load_state_dict(mega.state_dict())
        with torch.no_grad():
            return model(ids, key_mask)[0]

    with torch.no_grad():
        expected = mega(ids, key_mask)[0]
    # fp32 sums over n = 40 keys, chained through 30 Newton-Schulz iterations (2 matmuls each) and the model
    tol = tolerance(torch.float32, 40, reductions=2 * 30 + 8, scale=expected.abs().max())
    torch.testing.assert_close(megacur(40), expected, **tol)
    assert (megacur(8) - expected).abs().max() > 1e-5  # float32 round-off is ~1e-7 here


def test_old_nested_megacur_key_is_refused_by_hydra():
    with pytest.raises(ConfigCompositionException, match="attention.approximation.num_landmarks"):
        compose_config(["attention=megacur", "attention.approximation.num_landmarks=32"])


# --- attention.pinv_init --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PINV_VARIANTS)
def test_pinv_init_reaches_the_pseudo_inverse(name):
    """``global`` takes one maximum over the batch, so a sequence's output changes with its batch neighbour;
    ``per_head`` (default) does not. m = 6 < n: an approximation, 6 iterations: not converged."""
    heads = 1 if name == "megacur" else 2
    q, k, v = random_qkv(batch=2, heads=heads, n=24, d=8, dtype=torch.float32)
    q[1], k[1] = 3 * q[1], 3 * k[1]  # the neighbour is sharper: larger column sums
    mask = padded_mask(2, 24, [24, 20])
    alone = [x[:1] for x in (q, k, v)]
    outputs = {}
    for init in ("per_head", "global"):
        attn = build(name, ["attention.num_landmarks=6", f"attention.pinv_init={init}"])
        with torch.no_grad():
            outputs[init] = attn(q, k, v, mask)[:1], attn(*alone, mask[:1])
    batched, single = outputs["per_head"]
    # the same fp32 sums over n = 24 in another batch (another matmul blocking): 6 pinv iterations, 2 matmuls each
    torch.testing.assert_close(batched, single, **tolerance(torch.float32, 24, reductions=2 * 6 + 4, scale=single.abs().max()))
    batched, single = outputs["global"]
    assert (batched - single).abs().max() > 1e-3
    if heads == 1:  # batch = heads = 1: the two starts are the same
        torch.testing.assert_close(outputs["global"][1], outputs["per_head"][1], atol=0, rtol=0)


@pytest.mark.parametrize("name", PINV_VARIANTS)
def test_unknown_pinv_init_names_the_key(name):
    with pytest.raises(ValueError, match="attention.pinv_init"):
        build(name, ["attention.pinv_init=batch"])


# --- attention.linear -----------------------------------------------------------------------------------


@pytest.mark.parametrize("branch", ["delta", "elu"])
def test_linear_value_override_says_to_use_the_group_override(branch):
    cfg = compose_config(["attention=liza", f"attention.linear={branch}"])
    with pytest.raises(ValueError, match=f"attention/linear={branch}"):
        build_model(cfg)


def test_linear_group_override_builds_the_branch():
    model = build_model(compose_config(["attention=liza", "attention/linear=delta", "attention.linear.chunk_size=16"]))
    branches = [module.linear for module in attention_modules(model)]
    assert branches and all(isinstance(b, DeltaRuleAttention) and b.chunk_size == 16 for b in branches)


def test_materialised_softmax_is_the_dense_reference_and_ignores_padding():
    """``attention=softmax_materialised`` (the papers' "Transformer" row) computes the dense reference's weights
    times V; a sequence without any real key gives 0 rows (SDPA's convention), and pad tokens change nothing."""
    attn = build_attention(compose_config(["attention=softmax_materialised"]).attention, 2, 8).eval()
    assert attn.materialise
    q, k, v = random_qkv(n=24, dtype=torch.float64)
    mask = padded_mask(2, 24, [24, 0])
    y = attn(q, k, v, mask)
    expected = dense_softmax_weights(q[:1], k[:1], mask[:1]) @ v[:1]
    torch.testing.assert_close(y[:1], expected, **tolerance(torch.float64, 24, scale=1.0))  # |v| ~ 1: sums can cancel
    assert torch.equal(y[1], torch.zeros_like(y[1]))
    assert_padding_invariant(attn)


# --- keys a variant does not take ---------------------------------------------------------------------------

ATTENTIONS = sorted(path.stem for path in (REPO_ROOT / "configs" / "attention").glob("*.yaml"))


@pytest.mark.parametrize("name", ATTENTIONS)
def test_every_attention_config_passes_the_key_check(name):
    """The check reads the keys from the constructors: none of the shipped configs may be refused."""
    cfg = compose_config([f"attention={name}"])
    attention_factory(cfg.attention)
    if name != "flashcur":  # a Triton kernel: built on a GPU (or the interpreter) only
        build_model(cfg)


@pytest.mark.parametrize("name, override, named", [
    ("curformer", "+attention.num_landmark=32", "did you mean attention.num_landmarks?"),
    ("megacur", "+attention.num_landmark=32", "did you mean attention.num_landmarks?"),  # keys passed on to CUR
    ("nystromformer", "+attention.pinv_iter=3", "did you mean attention.pinv_iters?"),
    ("l1_cur", "+attention.score.lamb=2", "did you mean attention.score.lam?"),
    ("softmax", "+attention.num_landmarks=32", "the keys it takes: dropout, materialise."),
])
def test_an_unknown_attention_key_names_the_keys_of_that_attention(name, override, named):
    cfg = compose_config([f"attention={name}", override])
    key = override[1:].split("=")[0]
    with pytest.raises(ValueError, match=re.escape(f"{key} is not a key of ")) as error:
        attention_factory(cfg.attention)
    assert named in str(error.value)
    if name.endswith("cur") and "score" not in key:
        assert "num_landmarks, overwrite_rows, pinv_init, pinv_iters, same_indices" in str(error.value)


def test_an_unknown_model_key_names_the_keys_of_the_model():
    with pytest.raises(ValueError, match=re.escape("model.dropuot is not a key of model (models.encoder.Encoder): "
                                                   "did you mean model.dropout?")):
        build_model(compose_config(["+model.dropuot=0.2"]))
