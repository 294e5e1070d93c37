"""The chunked (UT-transform) delta rule against the token-by-token recurrence, in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attention.linear import DeltaRuleAttention, delta_rule_chunked

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def naive_delta_rule(q, k, v, beta):
    """``S_t = S_{t−1} + β_t (v_t − S_{t−1} k_t) k_tᵀ``, ``o_t = S_t q_t``, S (d_v × d_k) from 0, one token at a time."""
    batch, heads, n, d_k = k.shape
    state = torch.zeros(batch, heads, v.shape[-1], d_k, dtype=q.dtype)
    outputs = []
    for t in range(n):
        k_t, v_t, q_t = k[:, :, t], v[:, :, t], q[:, :, t]
        predicted = torch.einsum("bhvk,bhk->bhv", state, k_t)
        state = state + beta[:, :, t, None, None] * torch.einsum("bhv,bhk->bhvk", v_t - predicted, k_t)
        outputs.append(torch.einsum("bhvk,bhk->bhv", state, q_t))
    return torch.stack(outputs, 2)


def random_inputs(n: int, seed: int = 0, batch: int = 2, heads: int = 2, dim: int = 4):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, dim, generator=generator, dtype=torch.float64) for _ in range(3))
    k = F.normalize(k, dim=-1)
    beta = torch.rand(batch, heads, n, generator=generator, dtype=torch.float64)
    return q, k, v, beta


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 7, 16, 64])
def test_chunked_equals_recurrence(chunk_size):
    q, k, v, beta = random_inputs(n=13)
    expected = naive_delta_rule(q, k, v, beta)
    assert torch.allclose(delta_rule_chunked(q, k, v, beta, chunk_size), expected, atol=1e-5, rtol=0)


def test_chunked_is_the_delta_rule_not_plain_linear_attention():
    """The ``−S k`` correction matters: with β = 1 and a repeated key, the value is overwritten, not added."""
    k = F.normalize(torch.ones(1, 1, 2, 2, dtype=torch.float64), dim=-1)
    v = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]], dtype=torch.float64)
    out = delta_rule_chunked(k, k, v, torch.ones(1, 1, 2, dtype=torch.float64), chunk_size=2)
    assert torch.allclose(out[0, 0, 1], torch.tensor([0.0, 1.0], dtype=torch.float64), atol=1e-12)


def bidirectional_reference(module, q, k, v, key_mask):
    """Mean of the naive recurrence over the real tokens only, forward and reversed, with the module's β and norms."""
    out = torch.zeros_like(v)
    beta_all = torch.sigmoid(torch.einsum("bhnd,hd->bhn", k, module.beta_weight.double()) + module.beta_bias.double()[:, None])
    for b in range(q.shape[0]):
        real = key_mask[b].nonzero().squeeze(-1)  # indices of real tokens, in order
        qb, kb, vb = (F.normalize(q[b : b + 1, :, real], dim=-1), F.normalize(k[b : b + 1, :, real], dim=-1), v[b : b + 1, :, real])
        bb = beta_all[b : b + 1, :, real]
        forward = naive_delta_rule(qb, kb, vb, bb)
        backward = naive_delta_rule(qb.flip(2), kb.flip(2), vb.flip(2), bb.flip(2)).flip(2)
        out[b, :, real] = (0.5 * (forward + backward))[0]
    return out


@pytest.mark.parametrize("chunk_size", [2, 5, 8, 32])
def test_bidirectional_module_with_padding(chunk_size):
    """Pads (here at the end of one sequence and in the middle of another) contribute nothing, in both directions."""
    torch.manual_seed(0)
    module = DeltaRuleAttention(num_heads=2, head_dim=4, chunk_size=chunk_size).double()
    with torch.no_grad():
        module.beta_weight.normal_()
        module.beta_bias.normal_()
    q, k, v, _ = random_inputs(n=11, seed=1)
    key_mask = torch.ones(2, 11, dtype=torch.bool)
    key_mask[0, 8:] = False
    key_mask[1, [2, 5, 6]] = False
    out = module(q, k, v, key_mask)
    expected = bidirectional_reference(module, q, k, v, key_mask)
    assert torch.allclose(real_rows(out, key_mask), real_rows(expected, key_mask), atol=1e-5, rtol=0)
    noisy_pads = [torch.where(key_mask[:, None, :, None], x, 100 * torch.randn_like(x)) for x in (q, k, v)]
    assert torch.allclose(real_rows(module(*noisy_pads, key_mask), key_mask), real_rows(out, key_mask), atol=1e-10)


def real_rows(x, key_mask):
    """``(B, H, n, d)`` -> ``(n_real_total, H, d)``: the rows of real tokens."""
    return x.transpose(1, 2)[key_mask]


def test_chunk_size_must_be_positive():
    with pytest.raises(ValueError, match="chunk_size"):
        DeltaRuleAttention(num_heads=1, head_dim=2, chunk_size=0)


def test_gradients_flow_through_chunked_form():
    """The UT solve is differentiable: gradients match those of the naive recurrence."""
    q, k, v, beta = random_inputs(n=9, seed=3)
    tensors = [x.clone().requires_grad_() for x in (q, k, v, beta)]
    delta_rule_chunked(*tensors, chunk_size=4).square().sum().backward()
    grads = [x.grad for x in tensors]
    reference = [x.clone().requires_grad_() for x in (q, k, v, beta)]
    naive_delta_rule(*reference).square().sum().backward()
    for got, want in zip(grads, (x.grad for x in reference)):
        assert torch.allclose(got, want, atol=1e-8)
