"""MEGA and MegaCUR: attention core against a reference written here, CUR = exact when m >= n_real,
chunking, padding invariance, config wiring, direct transfer and a training run of each."""

from __future__ import annotations

import json
import math
from functools import partial

import pytest
import torch

from attention.mega import CUR, Exact, Laplace, MegaAttention, Softmax
from lra.runtime.checkpoints import load_transferred_weights
from lra.build import build_model
from models.mega import MegaBlock
from tests.conftest import compose_config, run_cli

MAX_POS = 16


def gaussian() -> torch.distributions.Normal:
    """N(μ = √½, σ = √(1/4π)) in float64 (MEGA's laplace function is its CDF)."""
    two = torch.tensor(2.0, dtype=torch.float64)
    return torch.distributions.Normal(1 / two.sqrt(), 1 / (2 * torch.pi * two).sqrt())


def reference(q, k, v, key_mask, table, function: str) -> torch.Tensor:
    """Sequence by sequence: A_ij from q_i·k_j and table[j − i + MAX_POS − 1]; softmax or Gaussian-CDF (laplace)."""
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    n = q.shape[-2]
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    bias = table[j - i + MAX_POS - 1]
    for b in range(q.shape[0]):
        real = key_mask[b]
        dots = q[b, 0] @ k[b, 0].T
        if function == "softmax":
            logits = (dots / math.sqrt(q.shape[-1]) + bias)[:, real]
            out[b, 0] = torch.softmax(logits, -1) @ v[b, 0][real]
        else:
            cdf = gaussian().cdf
            out[b, 0] = cdf(dots / real.sum() + bias)[:, real] @ v[b, 0][real]
    return out


def make_attention(function: str, approximation) -> MegaAttention:
    return MegaAttention(1, 4, Softmax() if function == "softmax" else Laplace(), MAX_POS, approximation).double()


def inputs(n=8, lengths=(8, 5), seed=0):
    torch.manual_seed(seed)
    q, k = (2 * torch.randn(len(lengths), 1, n, 4, dtype=torch.float64) for _ in range(2))
    v = torch.randn(len(lengths), 1, n, 6, dtype=torch.float64)
    key_mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    return q, k, v, key_mask


def test_laplace_is_the_gaussian_cdf():
    x = torch.linspace(-3, 3, 101, dtype=torch.float64)
    normal = gaussian()
    got = Laplace()(x, torch.zeros(()), None, torch.ones(()), head_dim=4)
    torch.testing.assert_close(got, normal.cdf(x), atol=1e-12, rtol=0)


@pytest.mark.parametrize("function", ["softmax", "laplace"])
def test_exact_attention_matches_reference(function):
    attention = make_attention(function, Exact())
    with torch.no_grad():
        attention.score.bias.normal_(std=0.5)
    q, k, v, key_mask = inputs()
    with torch.no_grad():
        got = attention(q, k, v, key_mask)
    expected = reference(q, k, v, key_mask, attention.score.bias.detach(), function)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("function", ["softmax", "laplace"])
def test_megacur_equals_mega_when_every_real_token_is_selected(function):
    """m >= n_real: CUR selects all real tokens, U = A[real, real], so C U⁺ R V = A V (docs/design.md §2, "MEGA and MegaCUR")."""
    exact = make_attention(function, Exact())
    with torch.no_grad():
        exact.score.bias.normal_(std=0.5)
    cur = make_attention(function, CUR(num_landmarks=8, pinv_iters=30))
    cur.load_state_dict(exact.state_dict())  # same parameter names: MEGA -> MegaCUR transfer
    q, k, v, key_mask = inputs(n=10, lengths=(8, 5, 3))
    with torch.no_grad():
        got, expected = cur(q, k, v, key_mask), exact(q, k, v, key_mask)
    real = key_mask[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)
    longer = inputs(n=12, lengths=(12,))  # n_real > m: an approximation, not the exact rows
    with torch.no_grad():
        assert not torch.allclose(cur(*longer), exact(*longer), atol=1e-3)


def block(chunk_size, function="softmax", approximation=None, seed=0) -> MegaBlock:
    attention = partial(MegaAttention, max_positions=MAX_POS, function=Softmax() if function == "softmax" else Laplace(),
                        approximation=approximation() if approximation else Exact())
    torch.manual_seed(seed)
    return MegaBlock(8, 1, 16, 0.1, attention, z_dim=4, hidden_dim=8, ndim=3, chunk_size=chunk_size).double().eval()


@pytest.mark.parametrize("function", ["softmax", "laplace"])
def test_chunked_equals_unchunked_when_chunk_covers_sequence(function):
    x = torch.randn(2, 11, 8, dtype=torch.float64)
    key_mask = torch.arange(11)[None, :] < torch.tensor([[11], [6]])
    with torch.no_grad():
        torch.testing.assert_close(block(16, function)(x, key_mask, {}), block(None, function)(x, key_mask, {}), atol=1e-10, rtol=0)


def test_chunks_attend_within_themselves_with_local_positions():
    """c < n: each chunk of q, k, v is attended alone (positions restart at 0); a padded last chunk too."""
    chunked = block(4)
    q, k = torch.randn(2, 10, 4, dtype=torch.float64), torch.randn(2, 10, 4, dtype=torch.float64)
    v = torch.randn(2, 10, 8, dtype=torch.float64)
    key_mask = torch.arange(10)[None, :] < torch.tensor([[10], [7]])
    with torch.no_grad():
        got = chunked.chunked_attention(q, k, v, key_mask)
        for start in range(0, 10, 4):
            part = slice(start, start + 4)
            mask = key_mask[:, part]
            expected = chunked.attend(q[:, None, part], k[:, None, part], v[:, None, part], mask)[:, 0]
            rows = mask.unsqueeze(-1).expand_as(expected)
            torch.testing.assert_close(got[:, part][rows], expected[rows], atol=1e-12, rtol=0)


CUR_NODE = partial(CUR, num_landmarks=4)


@pytest.mark.parametrize("chunk_size,approximation", [(None, None), (4, None), (None, CUR_NODE), (4, CUR_NODE)])
def test_padding_invariance(chunk_size, approximation):
    """A sequence's real outputs do not depend on how much padding follows it, nor on the pads' values."""
    mega = block(chunk_size, "laplace", approximation)
    x = torch.randn(1, 9, 8, dtype=torch.float64)
    padded = torch.cat([x, 50 * torch.randn(1, 5, 8, dtype=torch.float64)], dim=1)
    with torch.no_grad():
        alone = mega(x, torch.ones(1, 9, dtype=torch.bool), {})
        with_pads = mega(padded, (torch.arange(14) < 9)[None], {})
    torch.testing.assert_close(with_pads[:, :9], alone, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", ["mega", "megacur"])
def test_attention_choice_switches_the_model_to_mega(name):
    cfg = compose_config([f"attention={name}"])
    assert cfg.model.block._target_ == "models.mega.MegaBlock" and cfg.model.num_heads == 1
    assert cfg.attention.max_positions == cfg.task.max_length
    assert isinstance(build_model(cfg).blocks[0], MegaBlock)


def test_ema_timescales_key_reaches_every_block():
    model = build_model(compose_config(["attention=megacur", "model.block.ema_timescales=[4,400]"]))
    for block in model.blocks:
        tau = 1 / torch.sigmoid(block.ema.alpha.detach())
        assert tau.min() >= 4 - 1e-4 and tau.max() <= 400 * (1 + 1e-4) and tau.max() > 100


def test_mega_attention_in_a_transformer_block_is_a_clear_error():
    with pytest.raises(ValueError, match="single-head"):
        build_model(compose_config(["attention=mega", "model=encoder"]))


def test_too_short_bias_table_is_a_clear_error():
    mega = block(None)
    with pytest.raises(ValueError, match="attention.max_positions"):
        mega(torch.randn(1, MAX_POS + 1, 8, dtype=torch.float64), torch.ones(1, MAX_POS + 1, dtype=torch.bool), {})


def test_mega_weights_transfer_to_megacur_without_skipping(tmp_path):
    """Direct transfer (CUR paper Table 3): same parameter names; with n <= m MegaCUR reproduces MEGA."""
    mega = build_model(compose_config(["attention=mega"])).eval()
    path = tmp_path / "mega.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in mega.state_dict().items()}}, path)
    megacur = build_model(compose_config(["attention=megacur", "attention.pinv_iters=30"])).eval()
    assert load_transferred_weights(megacur, path) == {"skipped": [], "initialised": []}
    ids = torch.randint(1, 17, (2, 40))
    key_mask = torch.arange(40)[None, :] < torch.tensor([[40], [25]])
    with torch.no_grad():
        torch.testing.assert_close(megacur(ids, key_mask)[0], mega(ids, key_mask)[0], atol=1e-4, rtol=0)


def train_sweep(overrides: list[str], sweep) -> dict[str, dict]:
    """Run ``python -m lra.train -m`` and return each job's results.json keyed by attention name."""
    proc = run_cli(["-m", "lra.train", "-m", *overrides, f"hydra.sweep.dir={sweep}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = {}
    for path in sweep.glob("*/results.json"):
        result = json.loads(path.read_text())
        jobs[result["attention"]] = {**result, "dir": path.parent}
    return jobs


def test_training_step_mega_and_megacur(tiny_listops_overrides, tmp_path):
    """Both variants train end to end on listops_small (one multirun, two jobs)."""
    jobs = train_sweep([*tiny_listops_overrides, "trainer.max_steps=2", "attention=mega,megacur"], tmp_path / "sweep")
    assert sorted(jobs) == ["mega", "megacur"]
    for result in jobs.values():
        assert result["status"] == "completed" and result["steps"] == 2
        assert result["config"]["model"]["block"]["_target_"] == "models.mega.MegaBlock"


@pytest.mark.slow
def test_mega_checkpoint_evaluates_as_megacur_through_the_cli(tiny_listops_overrides, tmp_path):
    """CUR paper Table 3 workflow: train MEGA, then ``python -m lra.evaluate ckpt_path=... attention=megacur``."""
    jobs = train_sweep([*tiny_listops_overrides, "attention=mega"], tmp_path / "sweep")
    ckpt = jobs["mega"]["dir"] / "checkpoints" / "last.ckpt"
    evaluation = tmp_path / "eval"
    proc = run_cli(["-m", "lra.evaluate", *tiny_listops_overrides, f"ckpt_path={ckpt}", "attention=megacur",
                    f"hydra.run.dir={evaluation}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((evaluation / "results.json").read_text())
    assert results["status"] == "completed" and results["skipped"] == [] and results["initialised"] == []
    assert results["config"]["attention"]["approximation"]["_target_"] == "attention.mega.CUR"


def test_transfer_experiment_composes_for_both_steps():
    """experiment=mega_transfer trains MEGA at its LRA sizes; the same experiment + attention=megacur evaluates."""
    train = compose_config(["experiment=mega_transfer"])
    assert (train.task.name, train.attention.name, train.model.d_model, train.model.num_layers) == ("listops", "mega", 80, 6)
    evaluate = compose_config(["experiment=mega_transfer", "attention=megacur"])
    assert evaluate.attention.approximation._target_ == "attention.mega.CUR" and evaluate.model.d_model == 80
