"""FAVOR+ (``attention/performer.py``) against performer-pytorch's ``FastAttention`` with the same features, and
the estimator's convergence to softmax as the number of features grows."""

import math

import pytest
import torch
from performer_pytorch import FastAttention

from attention.performer import PerformerAttention, orthogonal_gaussian_features
from lra.build import build_attention
from tests.attention_reference import assert_padding_invariant, dense_softmax_weights, max_real_error, padded_mask, random_qkv
from tests.conftest import compose_config

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def reference(ours: PerformerAttention, q, k, v, lengths):
    """performer-pytorch with our features, run on each sequence cut to its real tokens (it zeroes pad values
    only, so pad keys would enter its normaliser): ``(B, H, n, d)``, pad rows 0."""
    fast = FastAttention(dim_heads=q.shape[-1], nb_features=ours.features.shape[0]).double()
    fast.projection_matrix.copy_(ours.features)
    out = torch.zeros_like(q)
    for b, length in enumerate(lengths):
        out[b, :, :length] = fast(q[b:b + 1, :, :length], k[b:b + 1, :, :length], v[b:b + 1, :, :length])[0]
    return out


def test_matches_performer_pytorch_with_padding():
    q, k, v = random_qkv(n=21, d=8)
    mask = padded_mask(2, 21, [21, 13])
    attn = build_attention(compose_config(["attention=performer", "attention.num_features=20",
                                           "attention.eps=1e-4"]).attention, 2, 8).double()  # 20: 2 blocks + 4 rows
    assert max_real_error(attn(q, k, v, mask), reference(attn, q, k, v, [21, 13]), mask) < 1e-12


def test_lra_code_is_the_nystromformer_lra_call_of_performer_pytorch():
    """``attention.lra_code=true`` against mlpen/Nystromformer's ``LRA/code/attention_performer.py`` call, run whole
    on the padded batch: ``FastAttention(Q / d^¼, K / d^¼ · mask, V · mask)``; the pads then change the real rows
    (they are keys of score 0 in its normaliser), which the default form's padding test forbids."""
    q, k, v = random_qkv(n=21, d=8)
    mask = padded_mask(2, 21, [21, 13])
    attn = build_attention(compose_config(["attention=performer", "attention.num_features=20", "attention.eps=1e-4",
                                           "attention.lra_code=true"]).attention, 2, 8).double()
    fast = FastAttention(dim_heads=8, nb_features=20).double()
    fast.projection_matrix.copy_(attn.features)
    pads = mask[:, None, :, None]
    expected = fast(q * 8**-0.25, k * 8**-0.25 * pads, v * pads)
    torch.testing.assert_close(attn(q, k, v, mask), expected, rtol=1e-12, atol=1e-12)
    assert max_real_error(attn(q, k, v, mask), reference(attn, q, k, v, [21, 13]), mask) > 1e-3  # not our form


def test_features_are_orthogonal_within_a_block_and_seeded():
    omega = orthogonal_gaussian_features(20, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    directions = omega / omega.norm(dim=-1, keepdim=True)
    for block in (directions[:8], directions[8:16], directions[16:]):
        torch.testing.assert_close(block @ block.T, torch.eye(len(block), dtype=torch.float64))
    assert torch.equal(PerformerAttention(2, 8, 20, seed=3).features, PerformerAttention(2, 8, 20, seed=3).features)
    assert not torch.equal(PerformerAttention(2, 8, 20, seed=3).features, PerformerAttention(2, 8, 20, seed=4).features)


def test_estimator_converges_to_softmax_within_its_monte_carlo_error():
    """Lemma 2: each kernel entry's estimate has relative std ``√((exp(‖x+y‖²) − 1)/m)`` for i.i.d. features
    (orthogonal ones have less, Theorem 2); a weight ``K_ij/Σ_j K_ij`` and so an output row ``Σ_j w_ij v_j`` then
    err by about twice that times ``max|v|``. Bound: 6 such std (a miss at any of the entries is ~1e-9 likely)."""
    q, k, v = random_qkv(batch=1, heads=1, n=6, d=4, seed=5)
    q, k = 0.5 * q, 0.5 * k
    mask = torch.ones(1, 6, dtype=torch.bool)
    exact = dense_softmax_weights(q, k, mask) @ v
    x, y = q / 4**0.25, k / 4**0.25
    spread = (x[..., :, None, :] + y[..., None, :, :]).square().sum(-1).max().item()
    errors = {}
    for m in (16, 4096):
        attn = PerformerAttention(1, 4, num_features=m, eps=0.0).double()
        errors[m] = (attn(q, k, v, mask) - exact).abs().max().item()
    bound = 6 * 2 * math.sqrt(math.expm1(spread) / 4096) * v.abs().max().item()
    assert errors[4096] < bound, (errors, bound)
    assert errors[4096] < errors[16] / 4  # ~√(4096/16) = 16 times smaller in expectation


def test_padding_invariant():
    assert_padding_invariant(PerformerAttention(2, 8, num_features=32))


def test_redraw_every_k_training_steps_only():
    attn = PerformerAttention(1, 4, num_features=8, redraw_interval=2)
    q, k, v = random_qkv(batch=1, heads=1, n=5, d=4, dtype=torch.float32)
    mask = torch.ones(1, 5, dtype=torch.bool)
    seen = [attn.features.clone()]
    for _ in range(4):
        attn(q, k, v, mask)
        seen.append(attn.features.clone())
    changed = [not torch.equal(a, b) for a, b in zip(seen, seen[1:])]
    assert changed == [False, False, True, False]  # the 3rd call (step 2) redraws
    attn.eval()
    attn(q, k, v, mask)
    assert torch.equal(attn.features, seen[-1])
    assert torch.equal(PerformerAttention(1, 4, 8).train()(q, k, v, mask), PerformerAttention(1, 4, 8).train()(q, k, v, mask))


@pytest.mark.parametrize("key, value, match", [("num_features", 0, "attention.num_features"),
                                                ("redraw_interval", -1, "attention.redraw_interval"),
                                                ("eps", -1e-3, "attention.eps"),
                                                ("lra_code", "yes", "attention.lra_code")])
def test_bad_settings_name_their_key(key, value, match):
    with pytest.raises(ValueError, match=match):
        PerformerAttention(2, 8, **{key: value})


def test_a_run_recorded_before_lra_code_resumes_and_lra_code_true_does_not():
    """lra.runtime.results.ADDED_LATER: a Performer record without ``attention.lra_code`` (runs started before
    202664c) matches today's default command; the reference-code form is a different run."""
    from lra.runtime.run_dir import resolved, settings_differences

    current = resolved(compose_config(["task=listops_small", "attention=performer"]))
    old = {**current, "attention": {key: value for key, value in current["attention"].items() if key != "lra_code"}}
    assert settings_differences(old, current) == []
    reference_form = resolved(compose_config(["task=listops_small", "attention=performer", "attention.lra_code=true"]))
    assert settings_differences(old, reference_form) == [("attention.lra_code", False, True)]
