"""Sparse Transformer patterns (``attention/sparse_transformer.py``) against index sets written out from Child et al.
2019 §4.3 and LRA's ``sparse_attention.py`` (read with the fetch tool; no package computes them), the dense masked
softmax over those sets, and the exact limit (a pattern covering every pair = softmax)."""

import pytest
import torch

from attention.sparse_transformer import SparseTransformerAttention
from lra.build import build_attention
from tests.attention_reference import assert_padding_invariant, dense_softmax_weights, max_real_error, padded_mask, random_qkv
from tests.conftest import compose_config

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def allowed_set(i, n, pattern, l, c, causal):
    """The keys query i may see, as sets: fixed = same block ∪ summary columns; strided = band ∪ every l-th."""
    if pattern == "fixed":
        keys = {j for j in range(n) if j // l == i // l} | {j for j in range(n) if j % l == 0 or j % l >= l - c}
    else:
        keys = {j for j in range(n) if abs(i - j) < l} | {j for j in range(n) if (i - j) % l == 0}
    return {j for j in keys if j <= i} if causal else keys


def dense_reference(q, k, v, key_mask, pattern, l, c, causal):
    n = q.shape[-2]
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        allowed[i, sorted(allowed_set(i, n, pattern, l, c, causal))] = True
    logits = torch.einsum("bhid,bhjd->bhij", q, k) / q.shape[-1] ** 0.5
    logits = logits.masked_fill(~(allowed[None, None] & key_mask[:, None, None, :]), float("-inf"))
    return torch.softmax(logits, -1) @ v


@pytest.mark.parametrize("pattern", ["fixed", "strided"])
@pytest.mark.parametrize("causal", [True, False])
def test_matches_the_pattern_written_out(pattern, causal):
    q, k, v = random_qkv(n=19, d=4)
    mask = padded_mask(2, 19, [19, 13])
    attn = SparseTransformerAttention(2, 4, pattern=pattern, block_size=5, c=2, causal=causal, dropout=0.0)
    assert max_real_error(attn(q, k, v, mask), dense_reference(q, k, v, mask, pattern, 5, 2, causal), mask) < 1e-13


def test_lra_setting_from_the_config():
    """The config's defaults (fixed, l = 50, c = 10, causal) at n = 120, across blocks."""
    q, k, v = random_qkv(batch=1, n=120, d=4, seed=4)
    mask = torch.ones(1, 120, dtype=torch.bool)
    attn = build_attention(compose_config(["attention=sparse_transformer", "attention.dropout=0"]).attention, 2, 4)
    assert max_real_error(attn(q, k, v, mask), dense_reference(q, k, v, mask, "fixed", 50, 10, True), mask) < 1e-13


@pytest.mark.parametrize("pattern, block_size", [("fixed", 16), ("strided", 1)])
def test_a_pattern_covering_every_pair_is_softmax(pattern, block_size):
    q, k, v = random_qkv(n=16, d=8, seed=1)
    mask = padded_mask(2, 16, [16, 9])
    attn = SparseTransformerAttention(2, 8, pattern=pattern, block_size=block_size, c=1, causal=False, dropout=0.0)
    assert max_real_error(attn(q, k, v, mask), dense_softmax_weights(q, k, mask) @ v, mask) < 1e-13


@pytest.mark.parametrize("causal", [True, False])
def test_padding_invariant(causal):
    assert_padding_invariant(SparseTransformerAttention(2, 8, block_size=6, c=2, causal=causal, dropout=0.0))


def test_bad_settings_name_their_key():
    with pytest.raises(ValueError, match=r"attention\.c must be <= attention\.block_size"):
        SparseTransformerAttention(2, 8, block_size=4, c=5)
    with pytest.raises(ValueError, match=r"attention\.pattern"):
        SparseTransformerAttention(2, 8, pattern="axial")
    with pytest.raises(ValueError, match=r"attention\.block_size"):
        SparseTransformerAttention(2, 8, block_size=0)
