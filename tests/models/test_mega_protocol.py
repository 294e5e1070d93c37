"""MEGA's own LRA protocol (facebookresearch/mega examples/mega/README.lra.md, fairseq/models/lra/model.py):
the block's equations, norm type and placement, dropouts and EMA options against references written here, the
configs that compose it (model=mega_lra, experiment=mega_lra | mega_transfer | cur_table1), MegaCUR =
MEGA when every token is selected, and lra.analysis.comparability against lra/analysis/published.yaml."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lra import REPO_ROOT
from lra.analysis.comparability import comparability
from lra.build import attention_factory, build_model
from models.ema import BidirectionalEMA
from models.mega import MaskedBatchNorm, MegaBlock, ScaleNorm, sequence_norm
from tests.conftest import CONFIG_DIR, compose_config

PUBLISHED = yaml.safe_load((REPO_ROOT / "lra" / "analysis" / "published.yaml").read_text())
TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
NO_POSITIONS = "models.positions.NoPositions"  # MEGA's LRA encoder has no absolute positions


def direct_ema(ema: BidirectionalEMA, x: torch.Tensor, lags: int, shift: bool) -> torch.Tensor:
    """``silu(Σ_{0≤t−j<lags} k_f[t−j] x_j + Σ_{s≤j−t<lags} k_b[j−t] x_j + ω x_t)`` by explicit loops (one sequence)."""
    kernel = ema.kernel(x.shape[1], torch.float64).detach()  # (2, D, L): the kernel itself is tested in test_ema.py
    length = x.shape[1]
    y = torch.zeros_like(x)
    for t in range(length):
        for j in range(length):
            if 0 <= t - j < lags:
                y[:, t] += kernel[0, :, t - j] * x[:, j]
            if (1 if shift else 0) <= j - t < lags:
                y[:, t] += kernel[1, :, j - t] * x[:, j]
    return F.silu(y + ema.omega.detach() * x)


@pytest.mark.parametrize("truncation,shift", [(None, True), (4, False), (4, True), (50, True)])
def test_ema_shift_and_truncation_match_the_direct_sum(truncation, shift):
    torch.manual_seed(0)
    ema = BidirectionalEMA(5, ndim=3, truncation=truncation, shift=shift).double()
    with torch.no_grad():
        ema.delta.uniform_(-3, 3)  # slow decays: far lags matter, so truncation is visible
    x = torch.randn(1, 11, 5, dtype=torch.float64)
    with torch.no_grad():
        got = ema(x, torch.ones(1, 11, dtype=torch.bool))
    expected = direct_ema(ema, x, truncation or 11, shift)
    torch.testing.assert_close(got, expected, atol=1e-8, rtol=0)
    if truncation == 4 or shift:
        assert not torch.allclose(got, direct_ema(ema, x, 11, False), atol=1e-6)  # the options change the output


def test_scale_norm_and_masked_batch_norm():
    x = torch.randn(3, 7, 6, dtype=torch.float64)
    scale = ScaleNorm().double()
    with torch.no_grad():
        scale.scale.fill_(2.5)
    torch.testing.assert_close(scale(x), 2.5 * x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())
    key_mask = torch.arange(7)[None, :] < torch.tensor([[7], [4], [2]])
    batch = MaskedBatchNorm(6).double().train()
    reference = torch.nn.BatchNorm1d(6).double().train()
    got = batch(x, key_mask)
    torch.testing.assert_close(got[key_mask], reference(x[key_mask]))  # statistics over real tokens only
    assert (got[~key_mask] == 0).all()
    assert isinstance(sequence_norm(6, None), torch.nn.Identity)
    with pytest.raises(ValueError, match="model.block.norm"):
        sequence_norm(6, "group")


def attention_node(function: str = "softmax", cur: bool = False):
    """The attention factory of attention=mega / megacur (m = 64 >= the n used here)."""
    cfg = compose_config([f"attention={'megacur' if cur else 'mega'}", "task=listops"])
    node = OmegaConf.create(OmegaConf.to_container(cfg.attention, resolve=True))
    node.function = {"_target_": f"attention.mega.{function.capitalize()}"}
    iters = "pinv_iters" if "pinv_iters" in node else None
    if cur:  # enough Newton-Schulz iterations for an exact inverse of U
        (node if iters else node.approximation).pinv_iters = 40
    return attention_factory(node)


def mega_block(norm: str, prenorm: bool, cur: bool = False, function: str = "softmax", **options) -> MegaBlock:
    torch.manual_seed(0)
    return MegaBlock(8, 1, 16, 0.0, attention_node(function, cur), z_dim=4, hidden_dim=8, ndim=3,
                     norm=norm, prenorm=prenorm, **options).double()


def test_post_norm_block_ends_with_its_norm_and_pre_norm_does_not():
    x = 3 * torch.randn(2, 9, 8, dtype=torch.float64) + 1
    key_mask = torch.ones(2, 9, dtype=torch.bool)
    with torch.no_grad():
        post = mega_block("layer", prenorm=False).eval()(x, key_mask, {})
        pre = mega_block("layer", prenorm=True).eval()(x, key_mask, {})
        scaled = mega_block("scale", prenorm=False).eval()(x, key_mask, {})
    torch.testing.assert_close(post.mean(-1), torch.zeros(2, 9, dtype=torch.float64), atol=1e-10, rtol=0)
    torch.testing.assert_close(post.var(-1, unbiased=False), torch.ones(2, 9, dtype=torch.float64), atol=1e-3, rtol=0)
    torch.testing.assert_close(scaled.pow(2).mean(-1), torch.ones(2, 9, dtype=torch.float64), atol=1e-3, rtol=0)
    assert pre.mean(-1).abs().max() > 0.1  # pre-norm keeps the residual stream unnormalised


def test_hidden_dropout_and_attention_dropout_keys():
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    key_mask = torch.ones(2, 9, dtype=torch.bool)
    quiet = mega_block("layer", prenorm=False).train()  # dropout 0, hidden_dropout 0 (MEGA's ListOps values but dropout)
    torch.testing.assert_close(quiet(x, key_mask, {}), quiet(x, key_mask, {}))
    noisy = mega_block("layer", prenorm=False, hidden_dropout=0.5).train()
    assert not torch.allclose(noisy(x, key_mask, {}), noisy(x, key_mask, {}))
    with pytest.raises(ValueError, match="model.block.attention_dropout"):
        mega_block("layer", prenorm=False, attention_dropout=0.1)


@pytest.mark.parametrize("norm,prenorm,function", [("layer", False, "softmax"), ("scale", False, "softmax"),
                                                  ("batch", True, "laplace")])
def test_megacur_equals_mega_in_every_protocol_block(norm, prenorm, function):
    """m >= n_real: MegaCUR selects every real token and reproduces MEGA (CUR paper §6; docs/design.md §2, "MEGA and MegaCUR")."""
    options = {"ema_truncation": 6, "ema_shift": True}
    mega = mega_block(norm, prenorm, function=function, **options).eval()
    megacur = mega_block(norm, prenorm, cur=True, function=function, **options).eval()
    megacur.load_state_dict(mega.state_dict())
    x = torch.randn(2, 12, 8, dtype=torch.float64)
    key_mask = torch.arange(12)[None, :] < torch.tensor([[12], [7]])
    with torch.no_grad():
        got, expected = megacur(x, key_mask, {}), mega(x, key_mask, {})
    torch.testing.assert_close(got[key_mask], expected[key_mask], atol=1e-6, rtol=0)


def resolved(overrides: list[str], config_name: str = "train") -> dict:
    """A run's config as results.json stores it (unresolved container), for lra.analysis.comparability."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=overrides)
    return {key: value for key, value in OmegaConf.to_container(cfg, resolve=False).items() if key != "hydra"}


def value(config: dict, key: str):
    return OmegaConf.select(OmegaConf.create(config), key)


# MEGA's LRA commands and architectures, written out here (not read from the configs under test).
MEGA = {
    "listops": dict(layers=6, d=80, z=64, hidden=160, norm="layer", prenorm=False, fn="Softmax", lr=1e-3, batch=64, steps=90000),
    "text": dict(layers=4, d=128, z=64, hidden=256, norm="scale", prenorm=False, fn="Softmax", lr=4e-3, batch=50, steps=25000),
    "retrieval": dict(layers=6, d=128, z=64, hidden=256, norm="scale", prenorm=False, fn="Softmax", lr=3e-3, batch=64, steps=91960),
    "image": dict(layers=8, d=160, z=96, hidden=320, norm="batch", prenorm=True, fn="Laplace", lr=1e-2, batch=50, steps=180000),
    "pathfinder": dict(layers=6, d=128, z=64, hidden=256, norm="batch", prenorm=True, fn="Laplace", lr=1e-2, batch=128, steps=250000),
}


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("attention", ["mega", "megacur"])
def test_cur_table1_composes_megas_protocol_for_the_mega_rows(task, attention):
    cfg = compose_config(["experiment=cur_table1", f"task={task}", f"attention={attention}"])
    want = MEGA[task]
    got = (cfg.model.num_layers, cfg.model.d_model, cfg.model.block.z_dim, cfg.model.block.hidden_dim,
           cfg.model.block.norm, cfg.model.block.prenorm, cfg.model.positions._target_, cfg.model.final_norm.kind)
    assert got == (want["layers"], want["d"], want["z"], want["hidden"], want["norm"], want["prenorm"], NO_POSITIONS,
                   want["norm"] if want["prenorm"] else None)
    assert cfg.model.block.attention_function == want["fn"].lower()
    assert (cfg.model.block.hidden_dropout, cfg.model.block.ema_truncation, cfg.model.block.ema_shift) == (0.0, 1024, True)
    assert (cfg.scheduler.max_lr, cfg.task.datamodule.batch_size, cfg.trainer.max_steps) == (want["lr"], want["batch"], want["steps"])
    assert (list(cfg.optimizer.betas), cfg.optimizer.eps, cfg.trainer.gradient_clip_val) == ([0.9, 0.98], 1e-8, 1.0)


# The rest of MEGA's recipe per task ([cmd]: --weight-decay, --warmup-updates; eval once per epoch; classifier_out_dim).
RECIPE = {
    "listops": dict(wd=0.01, warmup=3000, eval=1500, head=160, std=0.1118),
    "text": dict(wd=0.01, warmup=10000, eval=500, head=256, std=0.0884),
    "retrieval": dict(wd=0.04, warmup=10000, eval=2298, head=256, std=0.0884),
    "image": dict(wd=0.02, warmup=9000, eval=900, head=320, std=0.0791),
    "pathfinder": dict(wd=0.01, warmup=50000, eval=1250, head=256, std=0.0884),
}


def test_one_protocol_file_per_task():
    files = sorted(path.stem for path in (REPO_ROOT / "configs" / "mega_protocol").glob("*.yaml"))
    assert files == sorted(TASKS)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("overrides", [["experiment=mega_lra"], ["experiment=mega_lra", "attention=megacur"],
                                       ["attention=mega", "model=mega_lra"]])
def test_mega_lra_composes_the_tasks_protocol_file(task, overrides):
    cfg = compose_config([*overrides, f"task={task}"])
    want, recipe = MEGA[task], RECIPE[task]
    assert (cfg.model.num_layers, cfg.model.d_model, cfg.model.ffn_dim, cfg.model.block.z_dim, cfg.model.block.hidden_dim) == (
        want["layers"], want["d"], want["hidden"], want["z"], want["hidden"])
    assert (cfg.model.block.norm, cfg.model.block.prenorm, cfg.model.block.attention_function) == (
        want["norm"], want["prenorm"], want["fn"].lower())
    assert (cfg.model.positions._target_, cfg.model.final_norm.kind, cfg.model.embedding_init_std) == (
        NO_POSITIONS, want["norm"] if want["prenorm"] else None, recipe["std"])
    assert (cfg.model.dropout, cfg.model.block.ndim, cfg.model.block.chunk_size) == (0.0 if want["prenorm"] else 0.1, 16, None)
    assert (cfg.model.block.hidden_dropout, cfg.model.block.ema_truncation, cfg.model.block.ema_shift) == (0.0, 1024, True)
    assert (cfg.optimizer.lr, cfg.scheduler.max_lr, cfg.optimizer.weight_decay) == (want["lr"], want["lr"], recipe["wd"])
    assert math.isclose(cfg.scheduler.max_lr / cfg.scheduler.div_factor, 1e-7) and cfg.scheduler.cycle_momentum is False
    assert (cfg.task.batch_size, cfg.task.datamodule.batch_size, cfg.trainer.max_steps, cfg.task.warmup_steps) == (
        want["batch"], want["batch"], want["steps"], recipe["warmup"])
    assert (cfg.trainer.val_check_interval, cfg.task.head.hidden_dim) == (recipe["eval"], recipe["head"])
    assert (list(cfg.optimizer.betas), cfg.optimizer.eps, cfg.trainer.gradient_clip_val) == ([0.9, 0.98], 1e-8, 1.0)


def test_a_task_without_a_mega_protocol_is_an_error():
    with pytest.raises(Exception, match="mega_protocol"):
        compose_config(["experiment=mega_lra", "task=listops_small"])


@pytest.mark.parametrize("task", ["listops", "image"])
def test_cur_table1_keeps_the_transformer_rows_on_the_papers_setting(task):
    cfg = compose_config(["experiment=cur_table1", f"task={task}", "attention=curformer"])
    assert (cfg.model.num_layers, cfg.model.d_model, cfg.model.num_heads) == (2, 64, 2)
    assert cfg.model.block._target_ == "models.blocks.TransformerBlock"
    assert (cfg.scheduler.max_lr, cfg.optimizer.weight_decay, cfg.trainer.gradient_clip_val) == (1e-4, 0.0, None)
    assert (cfg.task.datamodule.batch_size, cfg.trainer.max_steps) == (cfg.task.batch_size, cfg.task.max_steps)


@pytest.mark.parametrize("task,attention", [("image", "megacur"), ("text", "mega")])
def test_protocol_models_build_with_megas_modules(task, attention):
    model = build_model(compose_config(["experiment=cur_table1", f"task={task}", f"attention={attention}"]))
    block = model.blocks[0]
    assert type(model.position_embedding).__name__ == "NoPositions" and len(model.blocks) == MEGA[task]["layers"]
    assert type(block.attend.score.function).__name__ == MEGA[task]["fn"]
    expected_norm = {"batch": MaskedBatchNorm, "scale": ScaleNorm}[MEGA[task]["norm"]]
    assert isinstance(block.norm, expected_norm) and block.prenorm == MEGA[task]["prenorm"]
    assert isinstance(model.final_norm, expected_norm if MEGA[task]["prenorm"] else torch.nn.Identity)
    assert model.token_embedding.weight.std().item() == pytest.approx(MEGA[task]["d"] ** -0.5, rel=0.05)


def test_mega_transfer_trains_with_megas_listops_recipe_and_evaluates_as_megacur():
    train = compose_config(["experiment=mega_transfer"])
    assert (train.task.name, train.attention.name, train.model.d_model, train.model.num_layers) == ("listops", "mega", 80, 6)
    assert (train.optimizer.lr, list(train.optimizer.betas), train.optimizer.eps, train.optimizer.weight_decay) == (1e-3, [0.9, 0.98], 1e-8, 0.01)
    assert (train.task.batch_size, train.trainer.max_steps, train.task.warmup_steps, train.trainer.gradient_clip_val) == (64, 90000, 3000, 1.0)
    assert (train.scheduler.max_lr, train.scheduler.cycle_momentum, train.model.block.prenorm) == (1e-3, False, False)
    evaluate = compose_config(["experiment=mega_transfer", "attention=megacur"])
    assert evaluate.attention.approximation._target_ == "attention.mega.CUR"
    assert OmegaConf.to_container(evaluate.model, resolve=True) == OmegaConf.to_container(train.model, resolve=True)


def published_row(table: str, attention: str) -> dict:
    return next(row for row in PUBLISHED[table]["rows"] if row["attention"] == attention)


@pytest.mark.parametrize("task", TASKS)
def test_protocol_runs_are_comparable_with_the_published_mega_numbers(task):
    for attention in ("mega", "megacur"):
        config = resolved(["experiment=cur_table1", f"task={task}", f"attention={attention}"])
        assert comparability(config, published_row("cur_table1", attention)) is None, (task, attention)


def test_our_small_mega_is_not_set_beside_megas_numbers():
    reason = comparability(resolved(["attention=mega", "task=listops"]), published_row("cur_table1", "mega"))
    assert reason.startswith("not comparable: ") and "model.num_layers=2 (Ma et al. 2022: 6)" in reason
    image = resolved(["experiment=cur_table1", "task=image", "attention=mega", "model.block.attention_function=softmax"])
    assert "attention_function=softmax" in comparability(image, published_row("cur_table1", "mega"))
    listops_lr = resolved(["experiment=cur_table1", "task=listops", "attention=megacur", "scheduler.max_lr=1e-4"])
    assert "scheduler.max_lr=0.0001" in comparability(listops_lr, published_row("cur_table1", "megacur"))
    image_lr = resolved(["experiment=cur_table1", "task=image", "attention=megacur", "scheduler.max_lr=1e-3"])
    assert comparability(image_lr, published_row("cur_table1", "megacur")) is None  # the paper's Image lr is unknown
    softmax = comparability(resolved(["experiment=cur_table1", "attention=softmax"]), published_row("cur_table1", "softmax"))
    assert softmax.startswith("not comparable: Tay et al. 2020")


def test_transfer_row_needs_a_transferred_checkpoint():
    row = published_row("mega_transfer", "megacur")
    trained = resolved(["experiment=mega_transfer", "attention=megacur"])
    assert "ckpt_path=None" in comparability(trained, row)
    evaluated = resolved(["experiment=mega_transfer", "attention=megacur", "ckpt_path=/runs/mega/best.ckpt"], "evaluate")
    assert comparability(evaluated, row) is None
    assert comparability(resolved(["experiment=mega_transfer"]), published_row("mega_transfer", "mega")) is None
    assert math.isclose(published_row("mega_transfer", "mega")["acc"][0], 63.60)


def reference_block(block: MegaBlock, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """MEGA's block written out from its equations (Ma et al. 2022 §3; facebookresearch/mega
    ``MovingAverageGatedAttention``: one ``mx_proj`` split as u, z‖r, hx; ``z.unsqueeze(2) * gamma + beta``
    unbound as q, k), with LayerNorm, in eval mode; the EMA and the attention core are the block's own (each
    tested against its own reference)."""
    d, zd, hd = block.d_model, block.z_dim, block.hidden_dim

    def layer_norm(norm, t):
        return F.layer_norm(t, (d,), norm.weight, norm.bias, 1e-5)

    def linear(module, t):
        return t @ module.weight.T + module.bias

    X = layer_norm(block.norm, x) if block.prenorm else x
    V = F.silu(linear(block.v_proj, X))
    base = linear(block.mx_proj, block.ema(X, key_mask))
    u, zr, hx = base[..., :d], base[..., d : d + zd + hd], base[..., d + zd + hd :]
    u, zr = torch.sigmoid(u), F.silu(zr)
    z, r = zr[..., :zd], zr[..., zd:]
    q, k = torch.unbind(z.unsqueeze(2) * block.qk_gamma + block.qk_beta, dim=2)
    attended = block.attend(q[:, None], k[:, None], V[:, None], key_mask)[:, 0]
    h = F.silu(hx + linear(block.h_proj, attended * r))
    y = x + u * (h - x)
    if not block.prenorm:
        y = layer_norm(block.norm, y)
        return layer_norm(block.ffn_norm, y + linear(block.ffn[3], F.silu(linear(block.ffn[0], y))))
    return y + linear(block.ffn[3], F.silu(linear(block.ffn[0], layer_norm(block.ffn_norm, y))))


@pytest.mark.parametrize("prenorm", [True, False])
def test_block_equals_its_equations(prenorm):
    """The block (gates, projections, residuals, norms) equals the equations written out, with padding."""
    block = mega_block("layer", prenorm=prenorm).eval()
    with torch.no_grad():
        for parameter in block.parameters():  # away from the near-zero initialisation, so every gate matters
            parameter.add_(0.5 * torch.randn_like(parameter))
        x = torch.randn(2, 9, 8, dtype=torch.float64)
        key_mask = torch.ones(2, 9, dtype=torch.bool)
        key_mask[1, 6:] = False
        torch.testing.assert_close(block(x, key_mask, {}), reference_block(block, x, key_mask), rtol=1e-12, atol=1e-12)
