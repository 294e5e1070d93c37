"""`lra.analysis.diagnostics.depth_probe`: depths counted by hand, the probe's R² on targets with known answers,
block outputs equal to the encoder's own forward."""

from __future__ import annotations

import pytest
import torch

from lra.analysis.diagnostics import depth_probe
from lra.build import build_model
from lra.tasks.listops import tokenize
from tests.conftest import compose_config


def test_depths_and_root_digits_by_hand():
    ids = tokenize("[MAX 2 [MIN 3 4 ] 5 ]")
    assert depth_probe.bracket_depths(ids).tolist() == [1, 1, 2, 2, 2, 2, 1, 1]
    assert depth_probe.root_digits(ids).tolist() == [0, 1, 0, 0, 0, 0, 1, 0]


def test_held_out_r2_is_one_for_a_linear_target_and_near_zero_for_noise():
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(4000, 8, generator=generator)
    linear = features @ torch.arange(1.0, 9.0) + 3.0
    assert depth_probe.held_out_r2(features, linear, 2000) == pytest.approx(1.0, abs=1e-9)
    noise = torch.randn(4000, generator=generator)
    assert abs(depth_probe.held_out_r2(features, noise, 2000)) < 0.02  # 9 fitted weights on 2,000 rows


@pytest.mark.parametrize("attention", ["softmax", "megacur"])
def test_block_outputs_are_the_encoders_own(attention):
    """The hooked outputs of every block equal the states ``token_states`` passes between blocks."""
    torch.manual_seed(0)
    model = build_model(compose_config(["task=listops", f"attention={attention}", "model.dropout=0"])).eval()
    ids = tokenize("[MAX 2 [MIN 3 4 ] 5 [SM 1 [MED 7 8 9 ] ] ]")
    outputs = depth_probe.block_outputs(model, ids)
    with torch.no_grad():
        x = model.embed(torch.tensor([ids]))
        mask = torch.ones(1, len(ids), dtype=torch.bool)
        for block, hooked in zip(model.blocks, outputs, strict=True):
            x = block(x, mask, {})
            assert hooked.shape == (len(ids), x.shape[-1])
            torch.testing.assert_close(hooked, x[0])
    assert not any(block._forward_hooks for block in model.blocks)  # hooks removed


def test_main_probes_a_listops_small_checkpoint_named_by_its_task(tiny_listops, tmp_path, monkeypatch, capsys):
    """``--overrides task=listops_small`` builds the 200-position table such a checkpoint holds (``task=listops``,
    the default, would refuse it with a shape error) and prints an R² per block for both targets."""
    import sys

    config = compose_config(["task=listops_small"])
    model = build_model(config)
    path = tmp_path / "small.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}, path)
    argv = ["depth_probe", "--data", str(tiny_listops), "--ckpt", str(path), "--examples", "6"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(ValueError, match="position_embedding"):
        depth_probe.main()
    monkeypatch.setattr(sys, "argv", [*argv, "--overrides", "task=listops_small"])
    depth_probe.main()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[-2:]] == ["depth", "root_digit"]
    assert all(line.count("block ") == config.model.num_layers for line in lines[-2:])
