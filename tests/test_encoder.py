"""Encoder + softmax attention: shapes, padding invariance, equality with a dense reference."""

from __future__ import annotations

import math

import torch

from lra.module import build_attention, build_model
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
