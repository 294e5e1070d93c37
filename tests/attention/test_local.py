"""LRA's local attention (``attention/local.py``) against the ``local-attention`` package (non-overlapping windows:
``look_backward = look_forward = 0``) and a dense masked softmax for both groupings, with its exact limit."""

import pytest
import torch
from local_attention import LocalAttention as PackageLocalAttention

from attention.local import LocalAttention
from lra.build import build_attention
from tests.attention_reference import assert_padding_invariant, dense_softmax_weights, max_real_error, padded_mask, random_qkv
from tests.conftest import compose_config

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def dense_grouped(q, k, v, key_mask, block, strided):
    """Masked softmax over the full ``n × n`` scores, keeping pairs in the same group: position p of the
    zero-padded length n' is in group ``p // b`` (contiguous) or ``p mod (n'/b)`` (strided)."""
    n = q.shape[-2]
    padded = -(-n // block) * block
    position = torch.arange(n)
    group = position % (padded // block) if strided else position // block
    same = group[:, None] == group[None, :]
    logits = torch.einsum("bhid,bhjd->bhij", q, k) / q.shape[-1] ** 0.5
    allowed = same[None, None] & key_mask[:, None, None, :]
    return torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1) @ v


def test_matches_the_local_attention_package_with_padding():
    q, k, v = random_qkv(n=23, d=8)
    mask = padded_mask(2, 23, [23, 14])
    ours = build_attention(compose_config(["attention=local", "attention.block_size=5", "attention.dropout=0"]).attention, 2, 8)
    package = PackageLocalAttention(window_size=5, causal=False, look_backward=0, look_forward=0, autopad=True)
    assert max_real_error(ours(q, k, v, mask), package(q, k, v, mask=mask), mask) < 1e-13


@pytest.mark.parametrize("strided", [False, True])
def test_matches_the_dense_grouped_softmax(strided):
    q, k, v = random_qkv(n=22, d=4, seed=2)
    mask = padded_mask(2, 22, [22, 17])
    attn = LocalAttention(2, 4, block_size=6, grouping="strided" if strided else "contiguous", dropout=0.0)
    assert max_real_error(attn(q, k, v, mask), dense_grouped(q, k, v, mask, 6, strided), mask) < 1e-13


@pytest.mark.parametrize("grouping", ["contiguous", "strided"])
def test_one_block_covering_every_pair_is_softmax(grouping):
    q, k, v = random_qkv(n=12, d=8, seed=1)
    mask = padded_mask(2, 12, [12, 7])
    y = LocalAttention(2, 8, block_size=12, grouping=grouping, dropout=0.0)(q, k, v, mask)
    assert max_real_error(y, dense_softmax_weights(q, k, mask) @ v, mask) < 1e-13


def test_padding_invariant_for_contiguous_blocks():
    assert_padding_invariant(LocalAttention(2, 8, block_size=4, dropout=0.0))


def test_bad_settings_name_their_key():
    with pytest.raises(ValueError, match=r"attention\.block_size"):
        LocalAttention(2, 8, block_size=0)
    with pytest.raises(ValueError, match=r"attention\.grouping"):
        LocalAttention(2, 8, grouping="sliding")
