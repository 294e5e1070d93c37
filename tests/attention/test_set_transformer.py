"""Set Transformer ISAB (``attention/set_transformer.py``) against ``H = MAB(I, X)``, ``MAB(X, H)`` written out as the
authors' ``modules.py`` computes them (juho-lee/set_transformer, read with the fetch tool; no package): heads split
and stacked along the batch, per sequence cut to its real tokens, with the module's weights."""

import pytest
import torch

from attention.set_transformer import SetTransformerAttention
from lra.build import build_attention
from tests.attention_reference import assert_padding_invariant, dense_softmax_weights, max_real_error, padded_mask, random_qkv
from tests.conftest import compose_config

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def split(x, d):
    """The authors' ``torch.cat(X.split(d, 2), 0)``: ``(B, n, H·d)`` -> ``(H·B, n, d)``."""
    return torch.cat(x.split(d, 2), 0)


def merge(x, batch):
    """The authors' ``torch.cat(X.split(B, 0), 2)``: the inverse of :func:`split`."""
    return torch.cat(x.split(batch, 0), 2)


def mab_attention(q, k, v, d):
    """``Q_ + softmax(Q_ K_ᵀ/√d) V_`` per head on ``(1, ·, D)`` inputs (``MAB.forward`` before ``fc_o``, scale 1/√d)."""
    q_, k_, v_ = split(q, d), split(k, d), split(v, d)
    weights = torch.softmax(q_.bmm(k_.transpose(1, 2)) / d**0.5, 2)
    return q_, merge(weights.bmm(v_), q.shape[0])


def reference(attn: SetTransformerAttention, q, k, v, lengths):
    """Per sequence of real tokens: ``O = I' + Att(I', K, V)``, ``H = O + relu(fc_o(O))`` (MAB(I, X)); then MAB(X, H)'s
    attention ``Att(Q, fc_k(H), fc_v(H))`` without its residual (the block's). Pad rows 0."""
    batch, heads, n, d = q.shape
    joined = [x.transpose(1, 2).flatten(2) for x in (q, k, v)]  # (B, n, D): heads side by side, as the authors'
    inducing = attn.inducing.transpose(0, 1).flatten(1)[None]  # (1, m, D)
    out = torch.zeros_like(q)
    for b, length in enumerate(lengths):
        qb, kb, vb = (x[b:b + 1, :length] for x in joined)
        _, summary = mab_attention(inducing, kb, vb, d)
        o = inducing + summary
        h = o + torch.relu(attn.rff(o))
        _, y = mab_attention(qb, attn.k_induced(h), attn.v_induced(h), d)
        out[b, :, :length] = y[0].unflatten(-1, (heads, d)).transpose(0, 1)
    return out


def test_matches_mab_isab_written_out_with_padding():
    q, k, v = random_qkv(n=21, d=8)
    mask = padded_mask(2, 21, [21, 12])
    torch.manual_seed(0)
    attn = build_attention(compose_config(["attention=set_transformer", "attention.num_inducing=5"]).attention,
                           2, 8).double()
    with torch.no_grad():
        assert max_real_error(attn(q, k, v, mask), reference(attn, q, k, v, [21, 12]), mask) < 1e-12


def test_stage_one_with_the_queries_as_inducing_points_is_softmax_attention():
    """m = n and I' = Q: ``O − I' = softmax(QKᵀ/√d) V`` exactly (the output itself has no softmax limit)."""
    q, k, v = random_qkv(n=13, d=4)
    mask = padded_mask(2, 13, [13, 9])
    attn = SetTransformerAttention(2, 4, num_inducing=13).double()
    with torch.no_grad():
        out, _ = attn.induce(q, k, v, mask)
    expected = (dense_softmax_weights(q, k, mask) @ v).transpose(1, 2).flatten(2)
    assert (out - q.transpose(1, 2).flatten(2) - expected).abs().max() < 1e-13


def test_padding_invariant():
    torch.manual_seed(0)
    assert_padding_invariant(SetTransformerAttention(2, 8, num_inducing=6))


def test_bad_settings_name_their_key():
    with pytest.raises(ValueError, match=r"attention\.num_inducing"):
        SetTransformerAttention(2, 8, num_inducing=0)
