"""L1-distance attention (EcoTransformer eq. 1) against a dense (B, H, n, n, d) computation in the test."""

import pytest
import torch

from attention import build_attention
from attention.l1 import L1Attention
from attention.scores import L1Distance, L1Score
from tests.attention_reference import (
    assert_padding_invariant,
    bf16_training_step,
    dense_l1_weights,
    max_real_error,
    padded_mask,
    random_qkv,
)
from tests.conftest import compose_config


@pytest.mark.parametrize("lam", [1.0, 3.0])
def test_matches_dense_reference_with_padding(lam):
    q, k, v = random_qkv(n=30, d=8)
    mask = padded_mask(2, 30, [30, 17])
    y = L1Attention(2, 8, lam=lam)(q, k, v, mask)
    assert max_real_error(y, dense_l1_weights(q, k, mask, lam) @ v, mask) < 1e-12


def test_sign_closest_key_gets_the_largest_weight():
    k = torch.tensor([[0.0, 0.0], [5.0, 5.0], [1.0, -1.0]]).view(1, 1, 3, 2)
    q = torch.tensor([[4.5, 5.5]]).view(1, 1, 1, 2)
    weights = L1Score()(q, k)
    assert weights.argmax().item() == 1
    expected = torch.softmax(-torch.tensor([10.0, 1.0, 10.0]) / 2**0.5, 0)
    assert torch.allclose(weights.flatten(), expected)


def test_masked_keys_get_exactly_zero_weight():
    q, k, _ = random_qkv(n=10, d=4)
    mask = padded_mask(2, 10, [10, 6])
    weights = L1Score()(q, k, mask[:, None, None, :])
    assert (weights[1, :, :, 6:] == 0).all()


def test_chunked_backward_matches_dense_autograd(monkeypatch):
    monkeypatch.setattr(L1Distance, "budget", 50)  # forces 1-query chunks
    q, k, v = (x.requires_grad_() for x in random_qkv(n=12, d=4))
    mask = padded_mask(2, 12, [12, 9])
    grads = torch.autograd.grad((L1Attention(2, 4)(q, k, v, mask) * v).sum(), (q, k, v))
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    dense = torch.autograd.grad(((dense_l1_weights(q2, k2, mask) @ v2) * v2).sum(), (q2, k2, v2))
    for fast, ref in zip(grads, dense):
        assert torch.allclose(fast, ref, atol=1e-10)


def test_gradcheck():
    q, k, v = (x.requires_grad_() for x in random_qkv(batch=1, n=6, d=3))
    mask = padded_mask(1, 6, [5])
    assert torch.autograd.gradcheck(lambda q, k, v: L1Attention(2, 3, lam=2.0)(q, k, v, mask), (q, k, v))


def test_padding_invariance():
    assert_padding_invariant(L1Attention(2, 8))


def test_bf16_training_step_is_finite():
    bf16_training_step(["attention=l1"])


def test_config_and_bad_lambda():
    attn = build_attention(compose_config(["attention=l1", "attention.lam=3"]).attention, 2, 32)
    assert isinstance(attn, L1Attention) and attn.score.lam == 3.0
    with pytest.raises(ValueError, match="lam"):
        build_attention(compose_config(["attention=l1", "attention.lam=-1"]).attention, 2, 32)
