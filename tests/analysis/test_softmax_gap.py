"""`lra.analysis.diagnostics.softmax_gap`: exact softmax has no gap, uniform attention reads uniform, an
approximation's gap shrinks as it approaches softmax, and the CLI compares two checkpoints of one model."""

from __future__ import annotations

import sys

import pytest
import torch

from lra.analysis.diagnostics import softmax_gap
from lra.build import build_model
from lra.tasks.listops import tokenize
from lra.analysis.diagnostics.root_attention import padded_batch
from tests.conftest import compose_config

SOURCES = ["[MAX 2 [MIN 3 4 ] 5 [SM 1 [MED 7 8 9 ] ] ]", "[MIN 9 [MAX 0 1 ] ]", "[SM 3 4 [MED 5 6 7 ] 8 ]"]


def model_and_batch(*overrides: str):
    torch.manual_seed(0)
    model = build_model(compose_config(["task=listops", "model.dropout=0", *overrides])).eval()
    input_ids, key_mask = padded_batch([tokenize(source) for source in SOURCES])
    return model, input_ids, key_mask


def test_exact_softmax_has_no_gap_and_scores_its_inputs():
    """Softmax's own float32 output is within float32 rounding of the float64 reference; the norms are the
    projections' (recomputed here by hand for layer 0)."""
    model, input_ids, key_mask = model_and_batch("attention=softmax")
    stats = softmax_gap.softmax_gaps(model, input_ids, key_mask)
    assert len(stats) == 2
    assert all(s["gap"] < 1e-5 for s in stats)
    with torch.no_grad():
        x = model.embed(input_ids)
        layer = model.blocks[0].attn
        q, k = layer.project(model.blocks[0].norm1(x), layer.q_proj, layer.k_proj)  # pre-LN block
    real = key_mask[:, None, :].expand(q.shape[:3])
    k_norms = (k.square().sum(-1) / layer.head_dim**0.5)[real]
    assert stats[0]["k_max"] == pytest.approx(k_norms.max().item(), rel=1e-5)


def test_zero_queries_give_uniform_attention():
    """With q = 0 softmax is uniform over the real keys: ``uniform`` is 0, ``entropy`` 1, ``|q|²`` 0."""
    model, input_ids, key_mask = model_and_batch("attention=softmax")
    for block in model.blocks:
        torch.nn.init.zeros_(block.attn.q_proj.weight)
        torch.nn.init.zeros_(block.attn.q_proj.bias)
    for s in softmax_gap.softmax_gaps(model, input_ids, key_mask):
        assert s["uniform"] < 1e-6 and s["q_max"] == 0.0
        assert s["entropy"] == pytest.approx(1.0, abs=1e-9)


def test_performer_gap_shrinks_with_features():
    """FAVOR+ estimates softmax: at 32,768 features its gap is a tenth of its gap at 4 and below plain averaging's
    (same model weights; measured 0.032 against 0.81, averaging 0.26)."""
    stats = {}
    for features in (4, 32768):
        model, input_ids, key_mask = model_and_batch("attention=performer", f"attention.num_features={features}")
        stats[features] = softmax_gap.softmax_gaps(model, input_ids, key_mask)[0]
    assert stats[32768]["gap"] < 0.1 * stats[4]["gap"]
    assert stats[32768]["gap"] < 0.5 * stats[32768]["uniform"]


def test_main_compares_checkpoints(tiny_listops, tmp_path, monkeypatch, capsys):
    """Two checkpoints of one model print one line per layer each; weights that differ give different gaps."""
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = build_model(compose_config(["task=listops", "attention=performer", "attention.num_features=16"]))
        path = tmp_path / f"seed{seed}.ckpt"
        torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}, path)
        paths.append(str(path))
    monkeypatch.setattr(sys, "argv", ["softmax_gap", "--data", str(tiny_listops), "--batch", "3", "--ckpt", *paths,
                                      "--overrides", "attention=performer", "attention.num_features=16"])
    softmax_gap.main()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  layer")]
    assert len(lines) == 4
    gaps = [float(line.split("gap ")[1].split()[0]) for line in lines]
    assert all(0 < gap for gap in gaps) and gaps[:2] != gaps[2:]


def test_a_variant_called_with_extra_rows_is_refused():
    """Proxyformer's layers attend over proxy rows and the tokens: no softmax over the same tokens to compare with."""
    model, input_ids, key_mask = model_and_batch("attention=proxyformer")
    with pytest.raises(ValueError, match="ProxyAttention is called otherwise"):
        softmax_gap.softmax_gaps(model, input_ids, key_mask)


@pytest.mark.parametrize("variant", [("attention=l1",), ("attention=l1_cur", "attention.num_landmarks=64")])
def test_l1_variants_are_compared_with_their_own_exact_attention(variant):
    """L1 attention is its exact form, and l1_cur with every token a landmark (m ≥ n) computes it exactly:
    both within float32 rounding of the float64 L1 softmax (the dot-product softmax would fail this)."""
    model, input_ids, key_mask = model_and_batch(*variant)
    assert all(s["gap"] < 1e-5 for s in softmax_gap.softmax_gaps(model, input_ids, key_mask))


def test_reformer_is_compared_with_shared_qk_attention():
    """Reformer's keys are its unit queries and a token sees itself only when alone: with one chunk holding the
    whole sequence (bucket_size ≥ n, every pair in reach) it is that exact attention; with chunks of 4 tokens it
    is not, and ``|k|²/√d`` is the unit keys' ``1/√d``."""
    model, input_ids, key_mask = model_and_batch("attention=reformer", "attention.bucket_size=64", "attention.n_hashes=1")
    stats = softmax_gap.softmax_gaps(model, input_ids, key_mask)
    assert all(s["gap"] < 1e-5 for s in stats)
    assert stats[0]["k_max"] == pytest.approx(model.blocks[0].attn.head_dim ** -0.5)
    model, input_ids, key_mask = model_and_batch("attention=reformer", "attention.bucket_size=4")
    assert all(s["gap"] > 1e-2 for s in softmax_gap.softmax_gaps(model, input_ids, key_mask))
