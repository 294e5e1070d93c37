"""Linformer (``attention/linformer.py``) against the ``linformer`` package's ``LinformerSelfAttention`` with the
same projections, its exact limit (k = n, E = F = I: softmax), and its padding and length rules."""

import pytest
import torch
from linformer import LinformerSelfAttention

from attention.linformer import LinformerAttention
from lra.build import build_attention
from tests.attention_reference import assert_padding_invariant, dense_softmax_weights, max_real_error, padded_mask, random_qkv
from tests.conftest import compose_config

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def package_reference(ours: LinformerAttention, q, k, v, lengths):
    """``LinformerSelfAttention`` (separate E, F shared by the heads) with identity q/k/v/out maps, fed
    ``x = [Q, 0]`` and ``context = [K, V]`` so it sees our q, k, v; each sequence cut to its real tokens (the
    package slices its projections to the length it gets, as we do). Pad rows 0."""
    batch, heads, n, d = q.shape
    width = heads * d
    ref = LinformerSelfAttention(dim=2 * width, seq_len=ours.max_length, k=ours.E.shape[1], heads=heads,
                                 dim_head=d).double()
    eye, zero = torch.eye(width, dtype=torch.float64), torch.zeros(width, width, dtype=torch.float64)
    with torch.no_grad():
        ref.to_q.weight.copy_(torch.cat([eye, zero], 1))
        ref.to_k.weight.copy_(torch.cat([eye, zero], 1))
        ref.to_v.weight.copy_(torch.cat([zero, eye], 1))
        ref.to_out.weight.copy_(torch.cat([eye, zero], 0))
        ref.to_out.bias.zero_()
        ref.proj_k.copy_(ours.E[0].T)
        ref.proj_v.copy_(ours.F[0].T)
    flat = [x.transpose(1, 2).reshape(batch, n, width) for x in (q, k, v)]
    out = torch.zeros_like(q)
    for b, length in enumerate(lengths):
        x = torch.cat([flat[0][b:b + 1, :length], torch.zeros(1, length, width, dtype=q.dtype)], -1)
        context = torch.cat([flat[1][b:b + 1, :length], flat[2][b:b + 1, :length]], -1)
        y = ref(x, context=context)[..., :width]  # (1, length, H·d)
        out[b, :, :length] = y.reshape(length, heads, d).transpose(0, 1)
    return out


def test_matches_the_linformer_package_with_padding():
    q, k, v = random_qkv(n=19, d=8)
    mask = padded_mask(2, 19, [19, 12])
    attn = LinformerAttention(2, 8, max_length=25, k=7, share_kv=False, per_head=False, init_std=0.3).double()
    assert max_real_error(attn(q, k, v, mask), package_reference(attn, q, k, v, [19, 12]), mask) < 1e-13


def test_per_head_shared_kv_is_eq_7_per_head():
    """The default (E = F, one per head) against eq. 7 written out head by head."""
    q, k, v = random_qkv(n=10, d=4, seed=3)
    mask = padded_mask(2, 10, [10, 6])
    attn = build_attention(compose_config(["attention=linformer", "task.max_length=12", "attention.k=5",
                                           "attention.init_std=0.5"]).attention, 2, 4).double()
    real = mask[:, None, :, None].double()
    expected = torch.stack([torch.softmax(q[:, h] @ (attn.E[h, :, :10] @ (k * real)[:, h]).transpose(-1, -2) / 2, -1)
                            @ (attn.E[h, :, :10] @ (v * real)[:, h]) for h in range(2)], 1)
    assert max_real_error(attn(q, k, v, mask), expected, mask) < 1e-13


def test_identity_projections_with_k_equal_n_give_softmax():
    q, k, v = random_qkv(n=12, d=8, seed=1)
    attn = LinformerAttention(2, 8, max_length=12, k=12, share_kv=False).double()
    with torch.no_grad():
        attn.E.copy_(torch.eye(12))
        attn.F.copy_(torch.eye(12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    torch.testing.assert_close(attn(q, k, v, mask), dense_softmax_weights(q, k, mask) @ v, rtol=1e-12, atol=1e-12)


def test_padding_invariant():
    assert_padding_invariant(LinformerAttention(2, 8, max_length=40, k=6))


def test_bad_settings_name_their_key():
    with pytest.raises(ValueError, match=r"attention\.k must be <= attention\.max_length"):
        LinformerAttention(2, 8, max_length=10, k=11)
    with pytest.raises(ValueError, match=r"attention\.k "):
        LinformerAttention(2, 8, max_length=10, k=0)
    q, k, v = random_qkv(n=12, d=8)
    with pytest.raises(ValueError, match=r"longer than attention\.max_length = 10"):
        LinformerAttention(2, 8, max_length=10, k=4)(q, k, v, torch.ones(2, 12, dtype=torch.bool))
