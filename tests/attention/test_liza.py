"""LiZA: ELU linear attention, sliding-window softmax, the memory gate, its schedule, conversion and training."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch
import torch.nn.functional as F

from attention.linear import DeltaRuleAttention, EluLinearAttention
from attention.liza import LiZAAttention
from attention.window import sliding_window_softmax
from tests.conftest import compose_config, run_cli
from tests.tolerances import tolerance
from lra.runtime.callbacks import MemoryGateSchedule
from lra.runtime.checkpoints import load_transferred_weights
from lra.build import build_model, build_module

SINGLE_THREAD = {"OMP_NUM_THREADS": "1"}  # the test machine's 2 cores are shared; avoid oversubscription

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def qkv(n=10, batch=2, heads=2, dim=4, seed=0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, dim, generator=generator, dtype=dtype) for _ in range(3)]


def padded_mask(n=10):
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n - 3 :] = False
    return mask


def real_rows(x, key_mask):
    """``(B, H, n, d)`` -> ``(n_real_total, H, d)``."""
    return x.transpose(1, 2)[key_mask]


def dense_attention(weights, v, key_mask):
    """Row-normalise non-negative ``weights`` ``(B, H, n, n)`` over real keys and apply them to ``v``."""
    weights = weights * key_mask[:, None, None, :]
    return (weights / weights.sum(-1, keepdim=True)) @ v


def test_elu_linear_attention_equals_dense_formula():
    q, k, v = qkv()
    key_mask = padded_mask()
    phi = lambda x: torch.where(x > 0, x + 1, torch.exp(x))  # noqa: E731 - ELU(x) + 1, written out
    expected = dense_attention(phi(q) @ phi(k).transpose(-1, -2), v, key_mask)
    out = EluLinearAttention(num_heads=2, head_dim=4)(q, k, v, key_mask)
    assert torch.allclose(real_rows(out, key_mask), real_rows(expected, key_mask), atol=1e-10)


@pytest.mark.parametrize("window", [0, 1, 3, 9, 10, 50])
def test_sliding_window_equals_banded_dense_softmax(window):
    q, k, v = qkv(n=10)
    key_mask = padded_mask()
    i = torch.arange(10)
    band = (i[:, None] - i[None, :]).abs() <= window
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(4)
    scores = scores.masked_fill(~(band & key_mask[:, None, None, :]), float("-inf"))
    expected = torch.softmax(scores, -1) @ v
    out = sliding_window_softmax(q, k, v, key_mask, window)
    assert torch.allclose(real_rows(out, key_mask), real_rows(expected, key_mask), atol=1e-10)


def test_sliding_window_at_least_n_is_full_softmax_across_query_blocks():
    """n = 150 spans several query blocks; window ≥ n must reproduce SDPA with the padding mask."""
    q, k, v = qkv(n=150, dtype=torch.float32)
    key_mask = padded_mask(150)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :])
    out = sliding_window_softmax(q, k, v, key_mask, window=150)
    # two fp32 softmax-attentions over n = 150 keys (QKᵀ, softmax, AV), relative to the size of v
    tol = tolerance(torch.float32, 150, reductions=3, scale=v.abs().max())
    torch.testing.assert_close(real_rows(out, key_mask), real_rows(expected, key_mask), **tol)


@pytest.mark.parametrize("linear", [EluLinearAttention, DeltaRuleAttention])
@pytest.mark.parametrize("window", [None, 2])
def test_liza_padding_invariance(linear, window):
    """Real rows do not change when pad content changes or more pads are appended."""
    torch.manual_seed(0)
    attention = LiZAAttention(2, 4, linear=linear, base_window=window, mag=0.3).double().eval()
    q, k, v = qkv(n=10)
    key_mask = padded_mask()
    out = attention(q, k, v, key_mask)
    noisy = [torch.where(key_mask[:, None, :, None], x, 50 * torch.randn_like(x)) for x in (q, k, v)]
    assert torch.allclose(real_rows(attention(*noisy, key_mask), key_mask), real_rows(out, key_mask), atol=1e-10)
    longer = [F.pad(x, (0, 0, 0, 5), value=7.0) for x in (q, k, v)]
    longer_mask = F.pad(key_mask, (0, 5), value=False)
    assert torch.allclose(real_rows(attention(*longer, longer_mask), longer_mask), real_rows(out, key_mask), atol=1e-10)


@pytest.mark.parametrize("linear", [EluLinearAttention, DeltaRuleAttention])
@pytest.mark.parametrize("window", [None, 3])
def test_gate_zero_is_base_and_one_is_linear_exactly(linear, window):
    attention = LiZAAttention(2, 4, linear=linear, base_window=window, mag=0.0).double().eval()
    q, k, v = qkv()
    key_mask = padded_mask()
    base = attention.base(q, k, v, key_mask)
    assert torch.equal(attention(q, k, v, key_mask), base)
    attention.memory_gate.fill_(1.0)
    assert torch.equal(attention(q, k, v, key_mask), attention.linear(q, k, v, key_mask))
    attention.memory_gate.fill_(0.25)
    mixed = 0.75 * base + 0.25 * attention.linear(q, k, v, key_mask)
    assert torch.allclose(attention(q, k, v, key_mask), mixed, atol=1e-12)


def test_learned_gate_is_a_per_head_parameter_and_gets_gradients():
    attention = LiZAAttention(2, 4, linear=EluLinearAttention, mag=0.2, learned_gate=True).double()
    assert not hasattr(attention, "memory_gate") and MemoryGateSchedule.gates(attention) == []
    assert torch.allclose(attention.mag, torch.full((2,), 0.2, dtype=torch.float64))
    q, k, v = qkv()
    attention(q, k, v, padded_mask()).sum().backward()
    assert attention.gate_logit.grad is not None and attention.gate_logit.grad.abs().sum() > 0


@pytest.mark.parametrize("config_error", [{"base_window": -1}, {"mag": 1.5}, {"mag": 0.0, "learned_gate": True}])
def test_bad_config_values_name_the_key(config_error):
    with pytest.raises(ValueError, match="attention."):
        LiZAAttention(2, 4, linear=EluLinearAttention, **config_error)


def test_schedule_values():
    schedule = MemoryGateSchedule()  # the TPTT defaults 0.01 -> 0.5 over 100 steps
    assert [schedule.value_at(step) for step in (0, 50, 100, 200)] == pytest.approx([0.01, 0.255, 0.5, 0.5])
    assert MemoryGateSchedule(0.3, 0.3, 100).value_at(70) == pytest.approx(0.3)
    assert MemoryGateSchedule(0.01, 0.5, 0).value_at(0) == 0.5


def test_softmax_checkpoint_loads_into_liza_with_only_its_own_parameters_initialised(tmp_path):
    """Shared q/k/v/o: a softmax checkpoint fills every LiZA parameter except the delta rule's β and μ."""
    softmax = build_module(compose_config(["attention=softmax"]))
    ckpt = tmp_path / "softmax.ckpt"
    torch.save({"state_dict": softmax.state_dict()}, ckpt)
    liza = build_model(compose_config(["attention=liza", "attention/linear=delta"]))
    report = load_transferred_weights(liza, ckpt)
    own = {"attn.attend.memory_gate", "attn.attend.linear.beta_weight", "attn.attend.linear.beta_bias"}
    assert report == {"skipped": [], "initialised": sorted(f"blocks.{i}.{name}" for i in (0, 1) for name in own)}
    assert torch.equal(liza.blocks[1].attn.q_proj.weight, softmax.model.blocks[1].attn.q_proj.weight)


def test_cli_trains_liza_elu_with_window_and_logs_the_schedule(tiny_listops_overrides, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        ["-m", "lra.train", *tiny_listops_overrides, "attention=liza", "attention.base_window=4",
         "trainer.log_every_n_steps=1", f"hydra.run.dir={run_dir}"],
        env=SINGLE_THREAD,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((run_dir / "results.json").read_text())["status"] == "completed"
    rows = list(csv.DictReader(next(run_dir.glob("csv/**/metrics.csv")).open()))
    mag = {int(row["step"]): float(row["train/mag"]) for row in rows if row.get("train/mag")}
    schedule = MemoryGateSchedule()
    assert mag == pytest.approx({step: schedule.value_at(step) for step in range(4)})
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    saved = state["model.blocks.0.attn.attend.memory_gate"].item()  # the μ of the step it was saved at
    assert any(saved == pytest.approx(value) for value in mag.values()) and saved > schedule.start
