"""The ``linear`` row (Linear Transformer, Katharopoulos et al. 2020, eqs. 2-7) against the quadratic form.

No installable package computes it (``pytorch-fast-transformers`` ships as a source distribution that compiles
C++ extensions on install): the reference is the paper's eq. 2 with ``sim(q, k) = φ(q)ᵀφ(k)``, the full
``n × n`` similarity matrix normalised per row (the form the authors' ``LinearAttention`` reorders).
"""

import pytest
import torch
import torch.nn.functional as F

from attention.linear import EluLinearAttention
from lra.build import build_attention
from tests.attention_reference import assert_padding_invariant, max_real_error, padded_mask, random_qkv
from tests.conftest import compose_config

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def quadratic_linear_attention(q, k, v, key_mask):
    """Eq. 2: ``V'_i = Σ_j sim(q_i, k_j) v_j / Σ_j sim(q_i, k_j)``, ``sim = (elu+1)(q)ᵀ(elu+1)(k)``, pads excluded."""
    sim = torch.einsum("bhid,bhjd->bhij", F.elu(q) + 1, F.elu(k) + 1) * key_mask[:, None, None, :]
    return (sim / sim.sum(-1, keepdim=True)) @ v


def test_matches_the_quadratic_form_with_padding():
    q, k, v = random_qkv(n=23, d=8)
    mask = padded_mask(2, 23, [23, 11])
    y = build_attention(compose_config(["attention=linear"]).attention, 2, 8)(q, k, v, mask)
    assert max_real_error(y, quadratic_linear_attention(q, k, v, mask), mask) < 1e-13


def test_gradients_match_the_quadratic_form():
    q, k, v = (x.requires_grad_() for x in random_qkv(n=9, d=4, seed=2))
    mask = padded_mask(2, 9, [9, 6])
    fast = torch.autograd.grad(EluLinearAttention(2, 4)(q, k, v, mask)[:, :, :6].sum(), (q, k, v))
    dense = torch.autograd.grad(quadratic_linear_attention(q, k, v, mask)[:, :, :6].sum(), (q, k, v))
    for a, b in zip(fast, dense):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_padding_invariant():
    assert_padding_invariant(EluLinearAttention(2, 8))
