"""Proxyformer (attention/proxyformer.py, models/proxyformer.py, its configs): math against dense
references written here, padding invariance, dropout modes, injection, configs, a real training step."""

from __future__ import annotations

import csv
import math

import pytest
import torch
from hydra import compose, initialize_config_dir

from attention.proxyformer import DecomposedDropout, ProxyAttention, landmark_contrastive_loss
from lra.build import build_model
from lra.train import train
from models.encoder import Encoder
from models.proxyformer import ProxyEncoder
from tests.conftest import CONFIG_DIR, compose_config

SMALL = ["attention=proxyformer", "attention.num_proxies=8"]

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def small_model(overrides: list[str] = ()) -> ProxyEncoder:
    torch.manual_seed(0)
    return build_model(compose_config([*SMALL, *overrides])).eval()


def dense_proxy_reference(q, k, v, key_mask, landmarks, k1_keep=None, k2_keep=None):
    """Alg. 3 one sequence and head at a time, on the real keys only (no mask arithmetic), with K₁ and K₂ formed;
    ``k1_keep`` ``(B, H, n, m)`` / ``k2_keep`` ``(B, H, m, n)``: dropout multipliers applied to their entries."""
    batch, heads, n, d = q.shape
    m = landmarks.shape[-2]
    rows = []
    for b in range(batch):
        real = key_mask[b].nonzero().flatten()
        for h in range(heads):
            L = landmarks[b, h]
            k1 = torch.softmax(q[b, h] @ L.T / math.sqrt(d), dim=-1)
            k2 = torch.softmax(L @ k[b, h, real].T / math.sqrt(d), dim=-1)
            if k1_keep is not None:
                k1 = k1 * k1_keep[b, h]
            if k2_keep is not None:
                k2 = k2 * k2_keep[b, h][:, real]
            y_p = k2 @ v[b, h, real]
            rows.append(torch.cat([y_p, k1 @ y_p]))
    return torch.stack(rows).view(batch, heads, m + n, d)


def proxy_inputs(b=3, h=2, n=12, d=8, m=5):
    """float64 ``q, k, v`` ``(b, h, n, d)``, landmarks ``(b, h, m, d)`` (all requiring grad) and a mask with padding."""
    torch.manual_seed(0)
    tensors = [torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    landmarks = torch.randn(b, h, m, d, dtype=torch.float64, requires_grad=True)
    key_mask = torch.ones(b, n, dtype=torch.bool)
    key_mask[1, 7:] = False
    key_mask[2, 3:] = False
    return (*tensors, key_mask, landmarks)


def outputs_and_grads(fn, inputs):
    """``fn(*inputs)`` and the gradients of a fixed random projection of it w.r.t. the float inputs."""
    out = fn(*inputs)
    weights = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    leaves = [t for t in inputs if t.requires_grad]
    return out, torch.autograd.grad((out * weights).sum(), leaves)


def test_attention_matches_dense_reference_with_padding():
    inputs = proxy_inputs()
    attn = ProxyAttention(num_heads=2, head_dim=8, num_proxies=5).eval()
    out, grads = outputs_and_grads(attn, inputs)
    expected, expected_grads = outputs_and_grads(dense_proxy_reference, inputs)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grads, expected_grads)  # q, k, v and landmarks


@pytest.mark.parametrize("mode", ["decomposed", "k1", "k2"])
def test_dropout_modes_match_dense_reference_with_the_same_masks(mode):
    """Training mode against the reference with the masks drawn from the same seed in the documented shapes:
    decomposed (B, H, n, 1) on V's rows = key columns of K₂, k1 (B, H, n, m), k2 (B, H, m, n)."""
    q, k, v, key_mask, landmarks = inputs = proxy_inputs()
    (b, h, n, _), m, p = q.shape, landmarks.shape[-2], 0.4
    attn = ProxyAttention(num_heads=h, head_dim=8, num_proxies=m, dropout_mode=mode, dropout=p).train()
    torch.manual_seed(7)
    out, grads = outputs_and_grads(attn, inputs)
    torch.manual_seed(7)
    shape = {"decomposed": (b, h, n, 1), "k1": (b, h, n, m), "k2": (b, h, m, n)}[mode]
    keep = (torch.rand(shape) >= p).double() / (1 - p)
    masks = {"k1_keep": keep} if mode == "k1" else {"k2_keep": keep.transpose(-1, -2) if mode == "decomposed" else keep}
    expected, expected_grads = outputs_and_grads(lambda *a: dense_proxy_reference(*a, **masks), inputs)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grads, expected_grads)
    assert 0 < (keep == 0).sum() < keep.numel()  # the test really dropped something


def test_model_is_invariant_to_padding():
    model = small_model()
    ids = torch.randint(1, 17, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.bool)
    padded_ids = torch.cat([ids, torch.randint(0, 17, (2, 9))], dim=1)  # pad ids need not be 0: the mask decides
    padded_mask = torch.cat([mask, torch.zeros(2, 9, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        logits, aux = model(ids, mask)
        padded_logits, padded_aux = model(padded_ids, padded_mask)
    torch.testing.assert_close(padded_logits, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded_aux["contrastive"], aux["contrastive"], atol=1e-5, rtol=1e-5)


def test_contrastive_loss_matches_dense_reference():
    torch.manual_seed(0)
    landmarks = torch.randn(2, 3, 6, 4, dtype=torch.float64)
    tau = 0.07
    terms = []
    for idx in torch.cartesian_prod(torch.arange(2), torch.arange(3)):
        z = [row / row.norm() for row in landmarks[idx[0], idx[1]]]
        for i in range(6):
            denominator = sum(math.exp(float(z[i] @ z[j]) / tau) for j in range(6))
            terms.append(-math.log(math.exp(float(z[i] @ z[i]) / tau) / denominator))
    expected = sum(terms) / len(terms)
    assert landmark_contrastive_loss(landmarks, tau).item() == pytest.approx(expected, rel=1e-6)


def test_contrastive_loss_small_for_orthonormal_large_for_duplicates():
    torch.manual_seed(0)
    m, d, tau = 6, 16, 0.07
    orthonormal = torch.linalg.qr(torch.randn(d, m, dtype=torch.float64)).Q.T * 3.0  # norm is divided out
    duplicated = torch.randn(1, d, dtype=torch.float64).repeat(m, 1)
    random = torch.randn(m, d, dtype=torch.float64)
    low, high, mid = (landmark_contrastive_loss(x, tau).item() for x in (orthonormal, duplicated, random))
    assert low == pytest.approx(math.log1p((m - 1) * math.exp(-1 / tau)), rel=1e-6)
    assert low < 1e-5
    assert high == pytest.approx(math.log(m), rel=1e-5)
    assert low < mid < high


def used_matrices(mode: str, training: bool, p: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """K₁ ``(B, H, n, m)`` and K₂ ``(B, H, m, n)`` as the attention used them (dropout included), read off its
    output: with ``V = I`` (head_dim = n) ``Y_p = K₂``, and ``Y_x = K₁ Y_p`` gives ``K₁ = Y_x Y_p⁺`` (K₂ has
    full row rank). float64, the same inputs on every call."""
    torch.manual_seed(0)
    b, h, n, m = 4, 2, 30, 6
    q, k, landmarks = (torch.randn(b, h, rows, n, dtype=torch.float64) for rows in (n, n, m))
    v = torch.eye(n, dtype=torch.float64).expand(b, h, n, n)
    attn = ProxyAttention(num_heads=h, head_dim=n, num_proxies=m, dropout_mode=mode, dropout=p).train(training)
    out = attn(q, k, v, torch.ones(b, n, dtype=torch.bool), landmarks)
    y_p, y_x = out[:, :, :m], out[:, :, m:]
    return y_x @ torch.linalg.pinv(y_p), y_p


def test_decomposed_dropout_zeroes_whole_key_columns_and_is_off_in_eval():
    p = 0.5
    k1, k2 = used_matrices("decomposed", True, p)
    k1_eval, k2_eval = used_matrices("decomposed", False, p)
    torch.testing.assert_close(k1, k1_eval)  # K₁ untouched
    zero_columns = (k2 == 0).all(dim=2)  # (B, H, n)
    kept_columns = torch.isclose(k2, k2_eval / (1 - p)).all(dim=2)
    assert torch.all(zero_columns ^ kept_columns)  # each key column is dropped whole or kept whole
    assert 0 < zero_columns.sum() < zero_columns.numel()
    assert not torch.equal(zero_columns[:, 0], zero_columns[:, 1])  # independent per head
    none_k1, none_k2 = used_matrices("none", True, p)
    assert torch.equal(none_k2, k2_eval) and torch.equal(none_k1, k1_eval)  # mode none drops nothing


@pytest.mark.parametrize("mode", ["k1", "k2"])
def test_element_dropout_modes_touch_only_their_matrix(mode):
    k1, k2 = used_matrices(mode, True)
    k1_eval, k2_eval = used_matrices(mode, False)
    dropped, untouched, untouched_eval = (k1, k2, k2_eval) if mode == "k1" else (k2, k1, k1_eval)
    torch.testing.assert_close(untouched, untouched_eval)
    zero = dropped.abs() < 1e-9
    partial_columns = (zero.any(dim=2) & ~zero.all(dim=2)).sum()
    assert partial_columns > 0  # element-wise: some columns are only partly zeroed


def test_dropout_switches_and_bad_mode():
    dropout = DecomposedDropout("k2", 0.5).train()
    assert dropout.drops("k2") and not dropout.drops("k1") and not dropout.drops("decomposed")
    assert not dropout.eval().drops("k2") and not DecomposedDropout("k2", 0.0).train().drops("k2")
    v = torch.rand(1, 1, 5, 3)
    assert DecomposedDropout("none", 0.5).train().drop_keys(v) is v
    with pytest.raises(ValueError, match="attention.dropout_mode"):
        DecomposedDropout("rows", 0.1)


def first_layer_landmarks(model: ProxyEncoder, ids: torch.Tensor) -> torch.Tensor:
    captured = []
    handle = model.blocks[0].attn.landmark_proj.register_forward_hook(lambda mod, args, out: captured.append(out))
    with torch.no_grad():
        model(ids, torch.ones_like(ids, dtype=torch.bool))
    handle.remove()
    return captured[0]


@pytest.mark.parametrize("injection", [False, True])
def test_first_layer_landmarks_depend_on_input_only_with_injection(injection):
    model = small_model([f"attention.injection={injection}"])
    a = first_layer_landmarks(model, torch.randint(1, 17, (1, 15)))
    b = first_layer_landmarks(model, torch.randint(1, 17, (1, 15)))
    assert torch.allclose(a, b) is (not injection)


def test_attention_config_selects_model_and_errors_on_mismatch():
    cfg = compose_config(["attention=proxyformer"])
    assert cfg.model._target_ == "models.proxyformer.ProxyEncoder"
    assert cfg.attention.num_proxies == 128 and cfg.attention.dropout_mode == "decomposed"
    plain = build_model(compose_config(["attention=proxyformer", "model=encoder"]))  # the command line wins
    assert type(plain) is Encoder
    with pytest.raises(ValueError, match="use attention=proxyformer without overriding"):
        plain(torch.randint(1, 17, (1, 10)), torch.ones(1, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match="model=proxyformer needs attention=proxyformer"):
        build_model(compose_config(["model=proxyformer", "attention=softmax"]))


def test_softmax_weights_transfer_with_only_proxy_parameters_new():
    softmax = build_model(compose_config(["attention=softmax"])).state_dict()
    proxy = build_model(compose_config(["attention=proxyformer"])).state_dict()
    assert all(proxy[key].shape == value.shape for key, value in softmax.items())
    assert sorted(set(proxy) - set(softmax)) == [
        "blocks.0.attn.landmark_proj.bias", "blocks.0.attn.landmark_proj.weight",
        "blocks.1.attn.landmark_proj.bias", "blocks.1.attn.landmark_proj.weight", "proxies",
    ]


TABLE3 = {  # Lee, Lee, Shin 2024, Table 3: (dropout, contrastive, injection)
    "plain": ("none", False, False),
    "contrastive": ("none", True, False),
    "k1": ("k1", False, False),
    "k2": ("k2", False, False),
    "decomposed": ("decomposed", False, False),
    "decomposed_contrastive": ("decomposed", True, False),
    "full": ("decomposed", True, True),
}


def test_table3_experiment_sweeps_rows_and_seeds():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=["experiment=proxyformer_table3"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    assert params.ablation.split(",") == list(TABLE3) and params.seed.split(",") == ["0", "1", "2", "3", "4"]
    for row, (dropout_mode, contrastive, injection) in TABLE3.items():
        node = compose_config(["experiment=proxyformer_table3", f"ablation={row}"]).attention
        assert (node.dropout_mode, node.contrastive, node.injection) == (dropout_mode, contrastive, injection)
        assert node.name == f"proxyformer-{row}"
    model = build_model(compose_config(["experiment=proxyformer_table3", "ablation=k2"]))  # interpolated node builds
    assert {block.attn.attend.dropout.mode for block in model.blocks} == {"k2"}
    assert not any(block.attn.attend.injection or block.attn.attend.contrastive for block in model.blocks)


def test_training_step_logs_contrastive(tiny_listops_overrides, tmp_path):
    overrides = [*tiny_listops_overrides, *SMALL, "trainer.log_every_n_steps=1", "trainer.max_steps=2", "task.eval_every=2"]
    cfg = compose_config(overrides, output_dir=tmp_path)
    metrics = train(cfg, tmp_path)
    assert metrics["steps"] == 2
    with open(next(tmp_path.glob("csv/*/metrics.csv"))) as handle:
        values = [float(row["train/contrastive"]) for row in csv.DictReader(handle) if row.get("train/contrastive")]
    assert len(values) == 2 and all(math.isfinite(v) and v > 0 for v in values)


def test_contrastive_switch_off_adds_no_loss():
    ids, mask = torch.randint(1, 17, (2, 10)), torch.ones(2, 10, dtype=torch.bool)
    assert set(small_model()(ids, mask)[1]) == {"contrastive"}
    assert small_model(["attention.contrastive=false"])(ids, mask)[1] == {}
