"""`lra.analysis.diagnostics`: root_attention against dense references (softmax, K₁ K₂, MEGA's biased softmax);
cue_agreement counted by hand."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from omegaconf import OmegaConf

from lra.analysis.diagnostics import root_attention as probe
from lra.build import build_model
from lra.tasks.listops import read_tsv
from tests.conftest import compose_config


def dense_root_ratio(model, input_ids: torch.Tensor, key_mask: torch.Tensor) -> float:
    """Layer 0 by hand: softmax(Q Kᵀ / √d) over real keys, column 0, mean over real queries, × n_real."""
    attn = model.blocks[0].attn
    hidden = model.blocks[0].norm1(model.embed(input_ids))
    q, k = (attn.split_heads(proj(hidden)) for proj in (attn.q_proj, attn.k_proj))
    logits = (q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim)).masked_fill(~key_mask[:, None, None, :], -math.inf)
    on_root = torch.softmax(logits, -1)[..., 0]  # (B, H, n)
    ratios = []
    for b in range(input_ids.shape[0]):
        n_real = int(key_mask[b].sum())
        ratios.append(on_root[b, :, :n_real].mean(-1) * n_real)
    return torch.stack(ratios).mean().item()


@pytest.fixture
def batch(tiny_listops):
    sequences, _ = read_tsv(tiny_listops / "basic_val.tsv")
    input_ids, key_mask = probe.padded_batch(sequences[:6])
    assert key_mask.sum(1).unique().numel() > 1  # padding is exercised
    return input_ids, key_mask


@pytest.mark.parametrize("variant", [["attention=softmax"], ["attention=curformer", "attention.num_landmarks=64"],
                                     ["attention=bigbird"]])
def test_layer0_weight_on_root_matches_dense_softmax(batch, variant):
    """Softmax, CUR selecting every real token, and BigBird with its blocks covering every pair (n' ≤ 4 blocks of
    64) are exact: they report the dense softmax's weight on key 0."""
    input_ids, key_mask = batch
    torch.manual_seed(3)
    model = build_model(compose_config(["task=listops", "model.dropout=0", *variant])).eval()
    with torch.no_grad():
        model.blocks[0].attn.k_proj.weight.mul_(20)  # sharpen attention so the weights are far from uniform
        expected = dense_root_ratio(model, input_ids, key_mask)
        ratios = probe.root_weights(model, input_ids, key_mask)
    assert len(ratios) == len(model.blocks)
    assert abs(expected - 1) > 0.05
    assert ratios[0] == pytest.approx(expected, rel=1e-4)


def test_uniform_attention_reads_one(batch):
    """With all queries zero, attention is uniform over real keys: the ratio is exactly 1 in every layer."""
    input_ids, key_mask = batch
    model = build_model(compose_config(["task=listops", "model.dropout=0", "attention=softmax"])).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q_proj.weight.zero_()
            block.attn.q_proj.bias.zero_()
        ratios = probe.root_weights(model, input_ids, key_mask)
    assert ratios == pytest.approx([1.0] * len(model.blocks), rel=1e-5)


def test_proxyformer_layer0_weight_on_root_matches_dense_k1_k2(batch):
    """Proxyformer's layers see ``[P; X]``: the probe reports column 0 of ``K₁ K₂`` built by hand (Alg. 3)."""
    input_ids, key_mask = batch
    torch.manual_seed(3)
    model = build_model(compose_config(["task=listops", "model.dropout=0", "attention=proxyformer",
                                        "attention.num_proxies=16"])).eval()
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.k_proj.weight.mul_(20)
        x = model.embed(input_ids)
        proxies = attn.attend.inject(model.proxies.expand(len(x), -1, -1), x, key_mask)
        hidden = model.blocks[0].norm1(torch.cat([proxies, x], dim=1))
        landmarks = attn.split_heads(attn.landmark_proj(hidden[:, :16]))
        q, k = (attn.split_heads(proj(hidden[:, 16:])) for proj in (attn.q_proj, attn.k_proj))
        scale = math.sqrt(attn.head_dim)
        k1 = torch.softmax(q @ landmarks.transpose(-1, -2) / scale, -1)  # (B, H, n, m)
        k2 = torch.softmax((landmarks @ k.transpose(-1, -2) / scale).masked_fill(~key_mask[:, None, None], -math.inf), -1)
        on_root = (k1 @ k2)[..., 0]  # (B, H, n)
        n_real = key_mask.sum(1)
        expected = torch.stack([on_root[b, :, : n_real[b]].mean(-1) * n_real[b] for b in range(len(x))]).mean().item()
        ratios = probe.root_weights(model, input_ids, key_mask)
    assert len(ratios) == len(model.blocks)
    assert abs(expected - 1) > 0.05
    assert ratios[0] == pytest.approx(expected, rel=1e-4)


def dense_mega_root_ratio(model, input_ids: torch.Tensor, key_mask: torch.Tensor) -> float:
    """Layer 0 of a MEGA model by hand: softmax(q kᵀ / √z + b[j − i]) over real keys from the q, k its
    attention core receives, column 0, mean over real queries, × n_real."""
    core = model.blocks[0].attend
    received = []
    hook = core.register_forward_hook(lambda module, args, _: received.append(args))
    model.token_states(input_ids, key_mask, {})
    hook.remove()
    q, k = received[0][:2]  # (B, 1, n, z_dim)
    n = q.shape[-2]
    positions = torch.arange(n)
    bias = core.score.bias[positions[None, :] - positions[:, None] + core.score.max_positions - 1]  # (n, n)
    logits = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias).masked_fill(~key_mask[:, None, None, :], -math.inf)
    on_root = torch.softmax(logits, -1)[..., 0]  # (B, 1, n)
    n_real = key_mask.sum(1)
    return torch.stack([on_root[b, :, : n_real[b]].mean(-1) * n_real[b] for b in range(len(q))]).mean().item()


@pytest.mark.parametrize("variant", [["attention=mega"], ["attention=megacur", "attention.num_landmarks=64"]])
def test_mega_layer0_weight_on_root_matches_dense_mega_softmax(batch, variant):
    """MEGA's gated attention is probed at its single-head core: exact MEGA, and MegaCUR selecting every real
    token (then exact), report the dense softmax-with-relative-bias weight on key 0."""
    input_ids, key_mask = batch
    torch.manual_seed(3)
    model = build_model(compose_config(["task=listops", "model.dropout=0", *variant])).eval()
    with torch.no_grad():
        model.blocks[0].mx_proj.weight.mul_(100)  # sharpen attention so the weights are far from uniform
        model.blocks[0].qk_gamma.mul_(50)
        expected = dense_mega_root_ratio(model, input_ids, key_mask)
        ratios = probe.root_weights(model, input_ids, key_mask)
    assert len(ratios) == len(model.blocks)
    assert abs(expected - 1) > 0.05
    assert ratios[0] == pytest.approx(expected, rel=1e-4)


def test_chunked_mega_is_refused(batch):
    """A chunked MEGA attention sees chunks, whose key 0 is not the root operator: the probe says so."""
    model = build_model(compose_config(["task=listops", "model.dropout=0", "attention=mega",
                                        "model.block.chunk_size=16"])).eval()
    with pytest.raises(ValueError, match="chunk_size=null"):
        probe.root_weights(model, *batch)


def test_cue_agreement_counts_by_hand():
    """``compare`` and ``labels_per_operator`` on labels whose answers are worked out by hand."""
    from lra.analysis.diagnostics.cue_agreement import compare, labels_per_operator

    targets = torch.tensor([0, 9, 4, 7, 3, 0])
    cue = torch.tensor([0, 9, 4, 7, 4, 9])  # wrong on examples 4 and 5
    model = torch.tensor([0, 9, 1, 7, 3, 0])  # right on 4 and 5, wrong on 2
    result = compare(model, cue, targets)
    assert result == {"model_acc": pytest.approx(5 / 6), "cue_acc": pytest.approx(4 / 6),
                      "agreement": pytest.approx(3 / 6), "model_acc_where_cue_wrong": 1.0, "cue_wrong": 2}
    operators = ["[MIN", "[MAX", "[MED", "[SM", "[MED", "[MED"]
    table = labels_per_operator(model, operators)
    assert table == {"[MIN": (0, 1.0, 1), "[MAX": (9, 1.0, 1), "[MED": (0, pytest.approx(1 / 3), 3), "[SM": (7, 1.0, 1)}


def test_cue_agreement_rebuilds_the_checkpoints_model(tiny_listops, tmp_path, monkeypatch, capsys, caplog):
    """A Nyströmformer checkpoint trained with rotary positions is probed as that model (its stored settings), not
    as the default attention without Nyström's conv or the default learned positions with a fresh position table."""
    import sys

    from lra.analysis.diagnostics import cue_agreement

    config = compose_config(["task=listops", "attention=nystromformer", "attention.num_landmarks=4",
                             "model/positions=rotary"])
    torch.manual_seed(0)
    model = build_model(config)
    settings = {group: OmegaConf.to_container(config[group], resolve=True) for group in ("attention", "model")}
    path = tmp_path / "rotary.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "settings": settings}, path)
    for name in ("train", "test"):  # the tiny split has no test file of its own: probe its val split as test
        source = tiny_listops / f"basic_{'val' if name == 'test' else name}.tsv"
        (tmp_path / f"basic_{name}.tsv").write_text(source.read_text())
    monkeypatch.setattr(sys, "argv", ["cue_agreement", "--data", str(tmp_path), "--ckpt", str(path)])
    cue_agreement.main()
    out = capsys.readouterr().out
    assert "[lra] model from the checkpoint" in out and "[lra] attention from the checkpoint: nystromformer" in out
    assert "not in the checkpoint" not in caplog.text  # no parameter (a learned position table) left at its init
    assert "skipped" not in caplog.text  # no checkpoint parameter (Nyström's conv) left out of the model


def test_pooled_prefix_matches_a_hand_pooled_mean(tiny_listops):
    """Pooled features without the first K tokens equal the mean of the real states K.. by hand (padding present);
    ``K = 0`` predictions are the model's own; a prefix as long as a sequence is refused."""
    from lra.analysis.diagnostics.pooled_prefix import pooled_without_prefix, predictions_without_prefix

    sequences, _ = read_tsv(tiny_listops / "basic_val.tsv")
    sequences = sequences[:6]
    input_ids, key_mask = probe.padded_batch(sequences)
    torch.manual_seed(3)
    model = build_model(compose_config(["task=listops", "model.dropout=0", "attention=megacur"])).eval()
    with torch.no_grad():
        states = model.token_states(input_ids, key_mask, {})
        for k in (1, 3):
            pooled = pooled_without_prefix(model, states, key_mask, k)
            for b, sequence in enumerate(sequences):
                assert torch.allclose(pooled[b], states[b, k : len(sequence)].mean(0), atol=1e-6)
        logits, _ = model(input_ids, key_mask)
    labels = predictions_without_prefix(model, sequences, [1, 3], batch=4)
    assert torch.equal(labels[0], logits.argmax(-1))
    with pytest.raises(ValueError, match="drop fewer than"):
        predictions_without_prefix(model, sequences, [min(map(len, sequences))], batch=4)


def test_a_variant_without_a_matrix_is_a_line_and_the_next_still_runs(tiny_listops, monkeypatch, capsys):
    """DBA and Luna mix heads (no per-head n × n matrix): each line gives the reason; softmax after them still prints."""
    monkeypatch.setattr(sys, "argv", ["root_attention", "--data", str(tiny_listops), "--batch", "3",
                                      "--variants", "attention=dba", "attention=luna", "attention=softmax"])
    probe.main()
    lines = capsys.readouterr().out.splitlines()
    for name in ("dba", "luna"):
        assert any(f"attention={name}" in line and f"refused: attention={name} has no per-head n x n" in line
                   for line in lines), lines
    assert any("attention=softmax" in line and "layer 1:" in line for line in lines)
