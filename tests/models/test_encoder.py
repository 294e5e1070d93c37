"""Encoder + softmax attention: shapes, padding invariance, equality with a dense reference."""

from __future__ import annotations

import math

import pytest
import torch

from lra import REPO_ROOT
from lra.build import build_attention, build_model
from models.blocks import MultiHeadAttention
from tests.conftest import compose_config


def dense_attention(q, k, v, key_mask):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    return scores.softmax(-1) @ v


def test_softmax_matches_dense_reference_with_padding():
    cfg = compose_config(["attention=softmax", "attention.dropout=0.0"])
    attention = build_attention(cfg.attention, num_heads=2, head_dim=8).double()
    q, k, v = torch.randn(3, 3, 2, 11, 8, dtype=torch.float64)
    key_mask = torch.arange(11) < torch.tensor([11, 7, 3])[:, None]
    torch.testing.assert_close(attention(q, k, v, key_mask), dense_attention(q, k, v, key_mask))


def test_appending_pad_tokens_does_not_change_logits():
    cfg = compose_config(["task=listops_small", "attention=softmax"])
    model = build_model(cfg).eval()
    ids = torch.randint(2, cfg.task.vocab_size, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    padded_ids = torch.cat([ids, torch.zeros(2, 6, dtype=torch.long)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(2, 6, dtype=torch.bool)], dim=1)
    logits, _ = model(ids, mask)
    padded_logits, _ = model(padded_ids, padded_mask)
    torch.testing.assert_close(padded_logits, logits, atol=1e-5, rtol=1e-5)
    assert logits.shape == (2, cfg.task.num_classes)


def test_multi_document_inputs_are_encoded_per_document():
    cfg = compose_config(["task=listops_small"])
    model = build_model(cfg).eval()
    ids = torch.randint(2, cfg.task.vocab_size, (3, 2, 7))
    mask = torch.ones(3, 2, 7, dtype=torch.bool)
    features = model.encode(ids.flatten(0, 1), mask.flatten(0, 1), {}).unflatten(0, (3, 2))
    first = model.encode(ids[:, 0], mask[:, 0], {})
    torch.testing.assert_close(features[:, 0], first)


def three_projections(attn, x):
    """``q, k, v`` as the three ``nn.Linear`` give them one by one (the form before the fused projection)."""
    return [attn.split_heads(proj(x)) for proj in (attn.q_proj, attn.k_proj, attn.v_proj)]


def test_one_qkv_gemm_gives_the_three_projections_and_keeps_their_keys():
    """``MultiHeadAttention.project``: one GEMM over the concatenated weights gives the three projections' q, k, v
    (float32 GEMMs of another width may sum in another order: a tolerance of a few ulps), and so the same layer
    output and attention matrix; the state dict keeps ``q_proj.weight`` … (committed checkpoints load strictly)."""
    cfg = compose_config(["task=listops_small", "attention=softmax", "attention.dropout=0.0"])
    model = build_model(cfg).eval()
    attn = model.blocks[0].attn
    assert {"blocks.0.attn.q_proj.weight", "blocks.0.attn.k_proj.bias", "blocks.0.attn.v_proj.weight",
            "blocks.0.attn.out_proj.weight"} <= set(model.state_dict())
    assert not any("qkv" in key for key in model.state_dict())
    x = torch.randn(3, 17, attn.q_proj.in_features)
    key_mask = torch.arange(17) < torch.tensor([17, 9, 4])[:, None]
    fused = attn.project(x, attn.q_proj, attn.k_proj, attn.v_proj)
    for got, expected in zip(fused, three_projections(attn, x)):
        assert got.shape == expected.shape == (3, attn.num_heads, 17, attn.head_dim)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    q, k, v = three_projections(attn, x)
    reference = attn.out_proj(attn.attend(q, k, v, key_mask).transpose(1, 2).flatten(2))
    torch.testing.assert_close(attn(x, key_mask), reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(attn.attention_matrix(x, key_mask),
                               attn.attend(q, k, attn.identity_values(q), key_mask), rtol=1e-5, atol=1e-6)


def test_one_qkv_gemm_backpropagates_into_each_projection():
    cfg = compose_config(["task=listops_small", "attention=softmax", "attention.dropout=0.0"])
    attn = build_model(cfg).blocks[0].attn
    x = torch.randn(2, 5, attn.q_proj.in_features)
    grads = []
    for project in (lambda: attn.project(x, attn.q_proj, attn.k_proj, attn.v_proj), lambda: three_projections(attn, x)):
        attn.zero_grad(set_to_none=True)
        q, k, v = project()
        (q.square().sum() + 2 * k.sum() + v.pow(3).sum()).backward()
        grads.append([p.grad.clone() for proj in (attn.q_proj, attn.k_proj, attn.v_proj) for p in proj.parameters()])
    for got, expected in zip(*grads):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_projection_with_a_hook_or_a_wrapper_is_called_as_a_module():
    """A hook on ``q_proj`` still sees its call (the projections are then called one by one), as a wrapped
    projection (LoRA's, tests/models/test_lora.py) runs its adapters."""
    cfg = compose_config(["task=listops_small", "attention=softmax", "attention.dropout=0.0"])
    attn = build_model(cfg).blocks[0].attn
    seen = []
    handle = attn.k_proj.register_forward_hook(lambda module, args, out: seen.append(out))
    x = torch.randn(2, 5, attn.q_proj.in_features)
    _, k, _ = attn.project(x, attn.q_proj, attn.k_proj, attn.v_proj)
    handle.remove()
    assert len(seen) == 1 and torch.equal(attn.split_heads(seen[0]), k)


@pytest.mark.parametrize("attention", sorted(path.stem for path in (REPO_ROOT / "configs" / "attention").glob("*.yaml")))
def test_the_attention_matrix_is_what_the_layer_applies_to_its_values(attention):
    """``MultiHeadAttention.attention_matrix`` (the diagnostics' ``V = I``, n values wide) times the layer's own
    ``v`` is the layer's ``attend(q, k, v)`` on real queries, for every variant in that slot; a variant whose output
    is no linear map of ``V`` (DBA, Set Transformer) is refused with its name. Orthoformer draws its first landmark
    from the global generator: both calls get the same seed."""
    landmarks = ["attention.num_landmarks=8"] if attention in ("curformer", "l1_cur", "nystromformer") else []
    try:
        model = build_model(compose_config(["task=listops_small", f"attention={attention}", "model.dropout=0",
                                            *landmarks])).eval()
    except (ValueError, RuntimeError) as refusal:  # FlashCUR without CUDA or TRITON_INTERPRET
        pytest.skip(str(refusal).splitlines()[0])
    layers = [m for m in model.modules() if type(m) is MultiHeadAttention]
    if not layers:
        pytest.skip(f"attention={attention} runs in a block of its own, not in models.blocks.MultiHeadAttention")
    layer = layers[0]
    x = torch.randn(2, 150, layer.q_proj.in_features, generator=torch.Generator().manual_seed(0))
    key_mask = torch.arange(150) < torch.tensor([150, 97])[:, None]
    if attention == "flashcur":  # its kernels take values as wide as the queries (CUDA or TRITON_INTERPRET only)
        with pytest.raises(ValueError, match="use attention=curformer"):
            layer.attention_matrix(x, key_mask)
        return
    if getattr(layer.attend, "no_attention_matrix", None):
        with pytest.raises(ValueError, match=f"attention={attention} has no per-head n x n attention matrix"):
            layer.attention_matrix(x, key_mask)
        return
    with torch.no_grad():
        torch.manual_seed(1)
        matrix = layer.attention_matrix(x, key_mask)  # (B, H, n, n)
        q, k, v = layer.project(x, layer.q_proj, layer.k_proj, layer.v_proj)
        torch.manual_seed(1)
        expected = layer.attend(q, k, v, key_mask)
    real = key_mask[:, None, :, None].expand_as(expected)
    torch.testing.assert_close((matrix @ v)[real], expected[real], rtol=1e-4, atol=1e-5)
