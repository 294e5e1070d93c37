"""DBA (``attention/dba.py``) against its equations written out per sequence, head and token (exp and sums, not
the module's batched softmaxes), on each sequence cut to its real tokens, with the module's weights; its r = 1
limit, permutation equivariance, padding and config errors."""

import pytest
import torch

from attention.dba import DBAAttention
from lra.build import build_attention
from tests.attention_reference import assert_padding_invariant, max_real_error, padded_mask, random_qkv
from tests.conftest import compose_config

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def normalised_exp(logits):
    """Row-wise ``exp(x − max) / Σ exp(x − max)``, written out."""
    e = torch.exp(logits - logits.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def affine(layer, x):
    return x @ layer.weight.T + layer.bias


def reference(attn: DBAAttention, q, k, v, lengths):
    """Per sequence of ℓ real tokens and head h: ``P_h = softmax(E_h (K W_pk)_hᵀ/√d_p')`` (r × ℓ), ``C = [P_h V_h]_h``,
    ``Z = LayerNorm([softmax((C W_q)_h (C W_k)_hᵀ/√d_p') (C W_v)_h]_h)``, ``Y_h = softmax((Q W_len)_h) Z_h``."""
    batch, heads, n, d = q.shape
    low, r = attn.low_dim, attn.proj_len
    out = torch.zeros_like(q)
    for b, length in enumerate(lengths):
        qs, ks, vs = (x[b, :, :length].transpose(0, 1).reshape(length, heads * d) for x in (q, k, v))  # (ℓ, D)
        pk, spread_logits = affine(attn.compress_keys, ks), affine(attn.decompress, qs)
        c = torch.cat([normalised_exp(attn.compress_queries[h] @ pk[:, h * low:(h + 1) * low].T / low**0.5)
                       @ vs[:, h * d:(h + 1) * d] for h in range(heads)], 1)  # (r, D)
        qc, kc, vc = affine(attn.q_low, c), affine(attn.k_low, c), affine(attn.v_low, c)
        z = torch.cat([normalised_exp(qc[:, h * low:(h + 1) * low] @ kc[:, h * low:(h + 1) * low].T / low**0.5)
                       @ vc[:, h * d:(h + 1) * d] for h in range(heads)], 1)
        z = (z - z.mean(-1, keepdim=True)) / (z.var(-1, unbiased=False, keepdim=True) + attn.norm.eps).sqrt()
        z = z * attn.norm.weight + attn.norm.bias
        for h in range(heads):
            out[b, h, :length] = normalised_exp(spread_logits[:, h * r:(h + 1) * r]) @ z[:, h * d:(h + 1) * d]
    return out


def randomised(attn):
    """Every parameter redrawn (the LayerNorm's affine too), so none is at an identity that would hide a slip."""
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(generator=torch.Generator().manual_seed(p.numel()))
    return attn


def test_matches_the_equations_written_out_with_padding():
    q, k, v = random_qkv(n=21, d=8)
    mask = padded_mask(2, 21, [21, 12])
    cfg = compose_config(["attention=dba", "attention.proj_len=5", "attention.hidden_dim=6"]).attention
    attn = randomised(build_attention(cfg, 2, 8).double())
    with torch.no_grad():
        assert max_real_error(attn(q, k, v, mask), reference(attn, q, k, v, [21, 12]), mask) < 1e-12


def test_one_compressed_token_gives_every_token_the_same_pooled_output():
    """r = 1: ``Y_i = LayerNorm(W_v Σ_j p_j v_j + b_v)`` for every i (attention and decompression are both over one
    token)."""
    q, k, v = random_qkv(batch=1, heads=2, n=9, d=4)
    mask = torch.ones(1, 9, dtype=torch.bool)
    attn = randomised(DBAAttention(2, 4, proj_len=1, hidden_dim=2).double())
    with torch.no_grad():
        y = attn(q, k, v, mask)
        keys = affine(attn.compress_keys, k[0].transpose(0, 1).reshape(9, 8))  # (n, d_p)
        pooled = torch.cat([torch.softmax((attn.compress_queries[h] @ keys[:, h:h + 1].T)[0], -1) @ v[0, h]
                            for h in range(2)])  # d_p' = 1: scale 1
        expected = attn.norm(affine(attn.v_low, pooled)).view(2, 4)
    assert (y[0] - expected[:, None, :]).abs().max() < 1e-13


def test_permuting_tokens_permutes_outputs():
    q, k, v = random_qkv(n=11, d=4)
    mask = torch.ones(2, 11, dtype=torch.bool)
    attn = randomised(DBAAttention(2, 4, proj_len=3, hidden_dim=4).double())
    order = torch.randperm(11, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y, y_permuted = attn(q, k, v, mask), attn(q[:, :, order], k[:, :, order], v[:, :, order], mask)
    assert (y[:, :, order] - y_permuted).abs().max() < 1e-13


def test_padding_invariant():
    torch.manual_seed(0)
    assert_padding_invariant(DBAAttention(2, 8, proj_len=6, hidden_dim=4))


@pytest.mark.parametrize("key, value", [("proj_len", 0), ("hidden_dim", 0), ("hidden_dim", 3)])
def test_bad_settings_name_their_key(key, value):
    with pytest.raises(ValueError, match=rf"attention\.{key}"):
        DBAAttention(2, 8, **{key: value})
