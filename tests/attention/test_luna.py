"""Luna (``attention/luna.py``, ``models/luna.py``) in float64 against a dense reference written here from the authors'
code (XuezheMax/fairseq-apollo: ``LunaLRAEncoder.forward``, ``LunaSentenceEncoderLayer.forward`` post-norm,
``LunarMultiheadAttention`` with ``tie_kv=False``): per-head score matrices, masked softmax, the batch's P cut to its
longest sequence. Plus the exact limit (a one-to-one pack makes the unpack softmax attention), padding invariance,
and the config errors."""

import pytest
import torch
import torch.nn.functional as F

from attention.luna import LunaAttention
from lra.build import build_model
from models.luna import LunaMultiHeadAttention
from tests.conftest import compose_config

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def luna_model(*overrides: str):
    """A float64 eval-mode Luna classifier on ListOps (d_model 64, 2 heads, 2 layers), seeded."""
    torch.manual_seed(0)
    cfg = compose_config(["attention=luna", "task=listops_small", *overrides])
    return build_model(cfg).double().eval(), cfg


def batch(lengths: list[int], n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``(B, n)`` (pads 0) and the real-token mask of sequences of ``lengths``."""
    ids = torch.randint(1, 15, (len(lengths), n), generator=torch.Generator().manual_seed(seed))
    mask = torch.arange(n) < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, 0), mask


def heads_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor, heads: int):
    """``(B, Lq, D)``, ``(B, Lk, D)`` x2, bool ``(B, Lk)`` -> ``(B, Lq, D)``: each head's ``softmax(q kᵀ/√d)`` with pad
    keys at -inf, written out one head at a time (the authors' bmm, masked_fill, softmax, bmm)."""
    d = q.shape[-1] // heads
    outs = []
    for h in range(heads):
        part = slice(h * d, (h + 1) * d)
        scores = (q[..., part] * d**-0.5) @ k[..., part].transpose(1, 2)
        weights = scores.masked_fill(~key_mask[:, None, :], float("-inf")).softmax(-1)
        outs.append(weights @ v[..., part])
    return torch.cat(outs, -1)


def reference_states(model, ids: torch.Tensor, key_mask: torch.Tensor, p: int, dynamic: bool) -> torch.Tensor:
    """The authors' LRA encoder (eval, post-norm, ``layernorm_embedding``) with the model's weights: ``(B, n, d)``."""
    lengths = key_mask.sum(1)
    rows = min(p, int(lengths.max())) if dynamic else p  # projected_embeddings[:max_len]
    x = model.embedding_norm(model.position_embedding.add(model.token_embedding(ids)))
    px = model.projection_norm(model.projections[:rows]).expand(len(ids), -1, -1)
    px_mask = torch.arange(rows) < lengths[:, None] if dynamic else torch.ones(len(ids), rows, dtype=torch.bool)
    for layer in model.blocks:
        attn, heads = layer.attn, layer.attn.num_heads
        pcontext = heads_attention(attn.pq_proj(px), attn.pk_proj(x), attn.pv_proj(x), key_mask, heads)  # pack
        y = attn.out_proj(heads_attention(attn.q_proj(x), attn.k_proj(pcontext), attn.v_proj(pcontext), px_mask, heads))
        x = layer.norm1(x + y)
        px = layer.projection_norm(px + pcontext)
        x = layer.norm2(x + layer.ffn(x))
    return x


@pytest.mark.parametrize("p, dynamic", [(5, True), (40, True), (5, False), (40, False)])
def test_encoder_matches_the_authors_layers_written_out(p, dynamic):
    """p below and above the padded length 24; two sequences of 13 and 9 real tokens: with dynamic projection the
    reference keeps 13 rows of P, ours min(p, 24), so the rows only ours carries must change nothing."""
    model, _ = luna_model(f"attention.projection_length={p}", f"attention.dynamic_projection={str(dynamic).lower()}")
    ids, mask = batch([13, 9], 24)
    with torch.no_grad():
        ours = model.token_states(ids, mask, {})
        expected = reference_states(model, ids, mask, p, dynamic)
    assert (ours - expected)[mask].abs().max() < 1e-12


def test_a_one_to_one_pack_makes_luna_softmax_attention():
    """Exact limit: P row i = c·(e_i, e_i) and keys reading a one-hot position code in both heads' halves, so each
    head's pack weights are exp(±c/√d) apart, c/√d = 1000: the identity exactly in float64 (e^-1000 underflows to 0).
    Then ``Y_P = X W_pv`` and Luna's output is softmax attention of ``X`` over itself with keys ``(X W_pv) W_k`` and
    values ``(X W_pv) W_v``. Sequence 2 has pads: its P rows past its length are masked (dynamic projection)."""
    torch.manual_seed(3)
    n, d, heads = 8, 8, 2
    attn = LunaMultiHeadAttention(2 * d, heads, lambda **kw: LunaAttention(**kw, projection_length=n, dropout=0.0))
    attn = attn.double().eval()
    code = torch.eye(n, dtype=torch.float64)
    x = torch.cat([code.expand(2, n, n), torch.randn(2, n, d, dtype=torch.float64)], -1)  # (B, n, 2d): position, content
    with torch.no_grad():
        attn.pq_proj.weight.copy_(torch.eye(2 * d)), attn.pq_proj.bias.zero_()
        attn.pk_proj.weight.copy_(torch.cat([torch.eye(d), torch.zeros(d, d)], 1).repeat(2, 1)), attn.pk_proj.bias.zero_()
    projected = 1000 * d**0.5 * torch.cat([code, code], -1).expand(2, n, 2 * d)
    key_mask = torch.arange(n) < torch.tensor([n, 5])[:, None]
    with torch.no_grad():
        y, packed = attn(x, projected, key_mask, attn.attend.projection_mask(key_mask))
        values = attn.pv_proj(x)
        q, k, v = attn.q_proj(x), attn.k_proj(values), attn.v_proj(values)
        expected = attn.out_proj(heads_attention(q, k, v, key_mask, heads))
    real = key_mask
    assert (packed - values)[real].abs().max() < 1e-12
    assert (y - expected)[real].abs().max() < 1e-12


@pytest.mark.parametrize("dynamic", [True, False])
def test_appended_pads_change_no_real_token(dynamic):
    """The pack reads real keys only and min(p, ℓ) counts real tokens: padding 16 -> 40 leaves logits and every
    real token's final state as they were (p = 24 sits between the two padded lengths)."""
    model, _ = luna_model("attention.projection_length=24", f"attention.dynamic_projection={str(dynamic).lower()}")
    short_ids, short_mask = batch([16, 7], 16)
    long_ids = F.pad(short_ids, (0, 24))
    long_mask = F.pad(short_mask, (0, 24))
    with torch.no_grad():
        short, long = model.token_states(short_ids, short_mask, {}), model.token_states(long_ids, long_mask, {})
        logits_short, logits_long = model(short_ids, short_mask)[0], model(long_ids, long_mask)[0]
    assert (short - long[:, :16])[short_mask].abs().max() < 1e-12
    assert (logits_short - logits_long).abs().max() < 1e-12


def test_dynamic_projection_uses_the_first_min_p_l_rows():
    attn = LunaAttention(2, 8, projection_length=6)
    mask = torch.arange(10) < torch.tensor([10, 4])[:, None]
    assert attn.projection_mask(mask).tolist() == [[True] * 6, [True] * 4 + [False] * 2]
    assert attn.projection_mask(mask[:, :4]).tolist() == [[True] * 4, [True] * 4]  # a batch of 4 carries 4 rows
    assert [attn.split_rows(attn.rows(n) + n) for n in (3, 6, 11)] == [(3, 3), (6, 6), (6, 11)]
    fixed = LunaAttention(2, 8, projection_length=6, dynamic_projection=False)
    assert fixed.projection_mask(mask[:, :4]).all() and fixed.projection_mask(mask).shape == (2, 6)


@pytest.mark.parametrize("override, message", [
    ("attention.projection_length=0", r"attention\.projection_length must be an integer >= 1, got 0"),
    ("attention.projection_length=-3", r"attention\.projection_length must be an integer >= 1, got -3"),
    ("attention.projection_length=2.5", r"attention\.projection_length must be an integer >= 1, got 2\.5"),
    ("attention.dropout=1.0", r"attention\.dropout must be in \[0, 1\), got 1\.0"),
    ("attention.dynamic_projection=sometimes", r"attention\.dynamic_projection must be true or false, got 'sometimes'"),
    ("model=encoder", None),
])
def test_bad_settings_are_refused_naming_the_key(override, message):
    if override == "model=encoder":  # Luna's attention under the plain Transformer blocks: refused when called
        model = build_model(compose_config(["attention=luna", "task=listops_small", override]))
        with pytest.raises(ValueError, match=r"attention=luna runs in its own layers \(model=luna"):
            model(*batch([5], 5))
        return
    with pytest.raises(ValueError, match=message):
        build_model(compose_config(["attention=luna", "task=listops_small", override]))


def test_luna_layers_refuse_another_attention():
    with pytest.raises(ValueError, match=r"model=luna needs attention=luna, got SoftmaxAttention"):
        build_model(compose_config(["attention=softmax", "task=listops_small", "model=luna"]))


def test_the_tables_settings_are_one_override_each():
    """CUR Table 1's Luna-256 is the default; Proxyformer Table 1's Luna-128 is projection_length=128."""
    assert luna_model()[0].projections.shape == (256, 64)
    assert luna_model("attention.projection_length=128")[0].projections.shape == (128, 64)


def test_a_softmax_checkpoint_loads_with_only_lunas_own_parameters_initialised(tmp_path):
    """Direct weight transfer (lra.runtime.checkpoints): the unpack keeps softmax's ``q/k/v/out_proj`` names."""
    from lra.runtime.checkpoints import load_transferred_weights

    softmax = build_model(compose_config(["task=listops_small"]))
    torch.save({"state_dict": {f"model.{k}": v for k, v in softmax.state_dict().items()}}, tmp_path / "softmax.ckpt")
    report = load_transferred_weights(luna_model()[0].float(), tmp_path / "softmax.ckpt")
    own = [f"blocks.{i}.{name}.{p}" for i in (0, 1) for name in ("attn.pk_proj", "attn.pq_proj", "attn.pv_proj",
                                                                 "projection_norm") for p in ("bias", "weight")]
    assert report == {"skipped": ["final_norm.bias", "final_norm.weight"],  # post-norm: no norm before pooling
                      "initialised": [*own, "embedding_norm.bias", "embedding_norm.weight", "projection_norm.bias",
                                      "projection_norm.weight", "projections"]}
