"""model/positions: rotary scores depend on positions only through their difference, every variant takes
rotary unchanged (CUR with every row selected is exact rotary attention, padding changes no real token),
L1 scores are refused, and the learned table keeps its checkpoint key."""

from __future__ import annotations

import pytest
import torch

from lra.build import build_model
from models.positions import Rotation, SinusoidalPositions, frequencies, rotate
from tests.conftest import compose_config

SMALL = ["task=listops_small", "model.dropout=0", "task.max_length=40"]


def model_with(*overrides: str, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(compose_config([*SMALL, *overrides])).double().eval()


def test_rotary_dot_products_depend_only_on_the_position_difference():
    torch.manual_seed(0)
    n, d = 24, 16
    rotation = Rotation(n, d, 10000.0).double()
    q, k = torch.randn(2, d, dtype=torch.float64)
    rq = rotate(q.expand(n, d), rotation.cos.double(), rotation.sin.double())  # the same vector at every position
    rk = rotate(k.expand(n, d), rotation.cos.double(), rotation.sin.double())
    scores = rq @ rk.T
    tolerance = 8 * 2**-24 * q.norm() * k.norm()  # the cos/sin tables are float32 (relative error ≤ 2⁻²⁴ each)
    for offset in range(-n + 1, n):
        diagonal = scores.diagonal(offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=0, atol=tolerance.item())
    # and the scores are not constant: positions matter
    assert scores.diagonal(0)[0] - scores.diagonal(5)[0] != pytest.approx(0, abs=1e-6)
    # the rotation of pair t at position i is i·θ_t (RoFormer eq. 34), angles by an independent formula
    i, t = 7, 3
    angle = i * 10000.0 ** (-2 * t / d)
    x = torch.zeros(d, dtype=torch.float64)
    x[t] = 1.0
    turned = rotate(x.expand(n, d), rotation.cos.double(), rotation.sin.double())[i]
    assert turned[t].item() == pytest.approx(torch.cos(torch.tensor(angle)).item(), abs=1e-7)
    assert turned[t + d // 2].item() == pytest.approx(torch.sin(torch.tensor(angle)).item(), abs=1e-7)


def test_sinusoidal_table_is_vaswani_et_al():
    table = SinusoidalPositions(10, 8).table.double()
    omega = frequencies(8, 10000.0)
    positions = torch.arange(10, dtype=torch.float64)[:, None]
    torch.testing.assert_close(table[:, 0::2], (positions * omega).sin(), rtol=0, atol=1e-6)
    torch.testing.assert_close(table[:, 1::2], (positions * omega).cos(), rtol=0, atol=1e-6)


def test_cur_with_every_row_selected_equals_exact_rotary_attention():
    ids = torch.randint(2, 17, (3, 30))
    mask = torch.ones(3, 30, dtype=torch.bool)
    mask[1, 20:] = False
    exact = model_with("model/positions=rotary", "attention=softmax", "attention.dropout=0")
    cur = model_with("model/positions=rotary", "attention=curformer", "attention.num_landmarks=64", "attention.pinv_iters=40")
    cur.load_state_dict(exact.state_dict())
    learned = model_with("model/positions=learned", "attention=softmax", "attention.dropout=0")
    torch.testing.assert_close(cur(ids, mask)[0], exact(ids, mask)[0], rtol=1e-9, atol=1e-9)
    # rotary really entered the model: the same weights without positions give other logits
    none = model_with("model/positions=none", "attention=softmax", "attention.dropout=0")
    none.load_state_dict(exact.state_dict())
    assert not torch.allclose(none(ids, mask)[0], exact(ids, mask)[0], atol=1e-6)
    assert "position_embedding.weight" in learned.state_dict() and not any("position" in key for key in exact.state_dict())


@pytest.mark.parametrize("attention", ["softmax", "curformer", "nystromformer", "proxyformer", "megacur", "liza"])
def test_padding_changes_no_real_token_with_rotary(attention):
    model = model_with("model/positions=rotary", f"attention={attention}")
    ids = torch.randint(2, 17, (2, 24))
    mask = torch.ones(2, 24, dtype=torch.bool)
    padded_ids = torch.cat([ids, torch.zeros(2, 16, dtype=torch.long)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(2, 16, dtype=torch.bool)], dim=1)
    torch.testing.assert_close(model(padded_ids, padded_mask)[0], model(ids, mask)[0], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("attention", ["l1", "l1_cur"])
def test_rotary_with_an_l1_score_is_refused_naming_the_key(attention):
    with pytest.raises(ValueError, match=r"model/positions=rotary: L1Score .* not be relative"):
        model_with("model/positions=rotary", f"attention={attention}")


def test_odd_head_size_is_a_clear_error():
    with pytest.raises(ValueError, match="even head size"):
        model_with("model/positions=rotary", "model.d_model=66", "model.num_heads=2")


def test_settings_of_checkpoints_from_before_the_positions_group_are_upgraded(tmp_path):
    from lra.runtime.checkpoints import training_settings

    for flag, kind in [(True, "LearnedPositions"), (False, "NoPositions")]:
        path = tmp_path / f"{flag}.ckpt"
        torch.save({"state_dict": {}, "settings": {"attention": {"name": "softmax"},
                                                     "model": {"d_model": 64, "learned_positions": flag}}}, path)
        model = training_settings(path)["model"]
        assert model == {"d_model": 64, "positions": {"_target_": f"models.positions.{kind}", "_partial_": True}}
