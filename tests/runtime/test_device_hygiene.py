"""Device hygiene: every variant trains on PyTorch's ``meta`` device with no host sync and no CPU-made tensor.

A ``meta`` tensor has a shape and a dtype but no values, as a GPU tensor looks from the host. Each
variant's model, built from its composed config (:func:`lra.build.build_model`), runs forward, the loss
(cross-entropy + auxiliary losses) and backward on ``meta`` in train mode (dropout on). A dispatch mode
watches every ATen op of the three: a host sync (``.item()``, ``bool(tensor)``, ``.tolist()``,
``nonzero``, anything whose result size depends on values) or a tensor on another device (made on the
CPU, e.g. ``torch.arange(n)`` without ``device=``) fails the test with the op's name. On a GPU each such
sync blocks the host until the device catches up, stalls the launch queue and breaks CUDA graphs and
``torch.compile`` graphs. CPU-only fast paths (branches on ``x.device.type``) are not reached here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from lra.config import CONFIG_DIR
from lra.build import build_model
from tests.conftest import compose_config

aten = torch.ops.aten

# ATen ops that read tensor values on the host (a device sync) or size their output by those values.
HOST_SYNC_OPS = {
    aten._local_scalar_dense.default,  # .item(), bool(t), int(t), float(t)
    aten.is_nonzero.default,
    aten.equal.default,
    aten.allclose.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
}


class HostSyncError(AssertionError):
    pass


class MetaOnly(TorchDispatchMode):
    """Raises on a host-syncing op or on any tensor argument or result that is not on ``meta``; counts ops."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_SYNC_OPS:
            raise HostSyncError(f"host sync: {func} (a value read on the host; on a GPU the host waits for the device)")
        self._check(func, (args, kwargs), "argument")
        out = func(*args, **kwargs)
        self._check(func, out, "result")
        self.ops += 1
        return out

    @staticmethod
    def _check(func, tree, role: str) -> None:
        for leaf in torch.utils._pytree.tree_leaves(tree):
            if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta":
                raise HostSyncError(
                    f"{func}: {role} on {leaf.device} {tuple(leaf.shape)} {leaf.dtype} among meta tensors "
                    "(a tensor made on the host: pass device= when creating it)"
                )


def train_step_on_meta(overrides: list[str], batch: int = 2, n: int = 160) -> tuple[torch.nn.Module, MetaOnly]:
    """Forward + loss + backward of the model composed with ``overrides``, on ``meta``, under :class:`MetaOnly`."""
    cfg = compose_config(["task=listops_small", "logger=csv", *overrides])
    model = build_model(cfg).to("meta").train()
    input_ids = torch.empty(batch, n, dtype=torch.long, device="meta")
    mask = torch.empty(batch, n, dtype=torch.bool, device="meta")
    label = torch.empty(batch, dtype=torch.long, device="meta")
    with MetaOnly() as mode:
        logits, aux_losses = model(input_ids, mask)
        loss = F.cross_entropy(logits.float(), label)
        for value in aux_losses.values():
            loss = loss + value
        loss.backward()
    return model, mode


VARIANTS = sorted(path.stem for path in (CONFIG_DIR / "attention").glob("*.yaml"))  # every variant, as it is added


@pytest.mark.parametrize("attention", VARIANTS)
def test_variant_trains_on_meta_without_host_sync(attention, monkeypatch):
    if attention == "flashcur":
        # Building FlashCUR refuses a machine with neither CUDA nor the Triton interpreter; on meta no kernel
        # runs (its torch.library ops' fake implementations give the shapes), so let the build through.
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    model, mode = train_step_on_meta([f"attention={attention}"])
    assert mode.ops > 0
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.device.type == "meta" for g in grads)
    assert model.token_embedding.weight.grad is not None


@pytest.mark.parametrize(
    "overrides",
    [
        ["attention=curformer", "attention.selection=step", "attention.same_indices=false", "attention.force_cls=true"],
        ["attention=nystromformer", "attention.pinv_init=global", "attention.num_landmarks=200"],
        ["attention=megacur", "model.block.chunk_size=32", "attention.function._target_=attention.mega.Laplace"],
        ["attention=mega", "model.block.chunk_size=32"],
        ["attention=liza", "attention/linear=delta", "attention.base_window=16", "attention.learned_gate=true"],
        ["attention=curformer", "model/positions=rotary"],
        ["attention=softmax", "model/positions=sinusoidal"],
        ["attention=proxyformer", "attention.dropout_mode=k1"],
        ["attention=proxyformer", "attention.dropout_mode=k2", "model/positions=rotary"],
        ["attention=performer", "attention.redraw_interval=1"],  # the redraw runs in every training step
    ],
    ids=["curformer-step", "nystromformer-global-short", "megacur-chunked-laplace", "mega-chunked", "liza-delta-window",
         "curformer-rotary", "softmax-sinusoidal", "proxyformer-k1", "proxyformer-k2-rotary", "performer-redraw"],
)
def test_other_settings_train_on_meta_without_host_sync(overrides):
    _, mode = train_step_on_meta(overrides)
    assert mode.ops > 0


def test_the_check_catches_host_syncs_and_cpu_tensors():
    x = torch.empty(2, 3, device="meta")
    with pytest.raises(HostSyncError, match="host sync"), MetaOnly():
        bool(x.all())
    with pytest.raises(HostSyncError, match="host sync"), MetaOnly():
        (x > 0).nonzero()
    with pytest.raises(HostSyncError, match="on cpu"), MetaOnly():
        x + torch.arange(3)
