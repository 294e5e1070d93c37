"""From config to objects: the one boundary where the composed Hydra config becomes the network, the attention
factory, the datamodule and the LightningModule (:class:`lra.module.LRAModule`).

Every config node is built with Hydra's ``instantiate`` from its ``_target_``; keys a constructor does not take are
refused naming the keys it does (:func:`lra.config_keys.check_keys`)."""

from __future__ import annotations

from typing import Callable

from torch import nn

from lra.config_keys import check_keys
from lra.module import LRAModule
from lra.runtime.checkpoints import run_settings


# Keys of an attention config node that describe it but are not constructor arguments (``impl``: the form it runs,
# set on the built module by attention.impl.configure).
DESCRIPTIVE_KEYS = ("name", "impl")
# Keys of a model config node that say how the network runs, not what it is (not constructor arguments).
RUNTIME_KEYS = ("compile",)
# Constructor arguments the code passes, not the config: the model's to the attention, build_model's to the model.
ATTENTION_SUPPLIED = ("num_heads", "head_dim")
MODEL_SUPPLIED = ("vocab_size", "max_length", "num_classes", "attention", "head")


def compile_setting(cfg) -> bool:
    """``model.compile`` of ``cfg`` (false where the node has no such key, e.g. an older checkpoint's settings),
    checked to be a boolean."""
    value = cfg.model.get("compile", False)
    if not isinstance(value, bool):
        raise ValueError(f"model.compile must be true or false (got {value!r}); e.g. model.compile=true compiles "
                         "the network with torch.compile (README \"Compiling\")")
    return value


def captures_cuda_graphs(cfg) -> bool:
    """Whether the run compiles the network for a GPU (``model.compile=true`` with ``trainer.accelerator`` gpu or
    cuda): :func:`compile_in_place` then captures each step in CUDA graphs, one per batch shape."""
    return compile_setting(cfg) and cfg.trainer.get("accelerator") in ("gpu", "cuda")


def build_datamodule(cfg):
    """The task's datamodule (``cfg.task.datamodule``). For CUDA graphs (:func:`captures_cuda_graphs`) a task of
    sequences of varying lengths whose ``task.pad_multiple`` is null pads every batch to ``task.max_length``: one
    batch shape, one graph (batches trimmed to their longest would capture a graph per length)."""
    from hydra.utils import instantiate

    node = cfg.task.datamodule
    if "pad_multiple" in node and node.pad_multiple is None and captures_cuda_graphs(cfg):
        print(f"[lra] model.compile=true on a GPU captures CUDA graphs, one per batch shape: batches padded to "
              f"task.max_length={cfg.task.max_length} (set task.pad_multiple to a fraction of it, with "
              f"task.group_by_length=true, for a few shapes and less padding)", flush=True)
        return instantiate(node, pad_multiple=cfg.task.max_length)
    return instantiate(node)


def attention_factory(node) -> Callable[..., nn.Module]:
    """The attention config node (``configs/attention/*.yaml``, ``_partial_: true``) instantiated into a
    factory ``factory(num_heads=, head_dim=) -> nn.Module``: the one place attention configs become objects.

    The node is resolved against the whole run config first (nodes may interpolate ``${task.max_length}``);
    its descriptive ``name`` is dropped. The head layout is supplied by the model, not by the config. A key the
    variant's constructor does not take is refused naming the keys it does (:func:`lra.config_keys.check_keys`).
    ``impl`` (``attention.impl``, default ``auto``) is the form the module runs: checked against the variant's forms
    and set on every module the factory builds (:func:`attention.impl.configure`).
    """
    from attention.impl import configure
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    if "_target_" not in node:
        raise ValueError(
            f"attention config has no _target_ (keys: {sorted(node.keys())}); "
            "pick one of configs/attention/*.yaml, e.g. attention=softmax"
        )
    container = OmegaConf.to_container(node, resolve=True)
    check_keys(container, "attention", supplied=ATTENTION_SUPPLIED, descriptive=DESCRIPTIVE_KEYS)
    partial = instantiate({key: value for key, value in container.items() if key not in DESCRIPTIVE_KEYS}, _partial_=True)
    impl, variant = container.get("impl") or "auto", container.get("name") or container["_target_"]

    def factory(**arguments) -> nn.Module:
        return configure(partial(**arguments), impl, f"attention={variant}")

    return factory


def build_attention(node, num_heads: int, head_dim: int) -> nn.Module:
    """One attention module of ``num_heads`` heads of size ``head_dim`` from its config node."""
    return attention_factory(node)(num_heads=num_heads, head_dim=head_dim)


def build_model(cfg) -> nn.Module:
    """The task's classifier with the configured attention: ``cfg.model`` is a ``_partial_`` encoder config,
    ``cfg.attention`` becomes the factory that every block calls (:func:`attention_factory`). The network is
    eager; ``model.compile`` (:data:`RUNTIME_KEYS`) is applied by whoever runs it
    (:meth:`lra.module.LRAModule.configure_model`)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    node = {key: value for key, value in OmegaConf.to_container(cfg.model, resolve=True).items()
            if key not in RUNTIME_KEYS}
    check_keys(node, "model", supplied=MODEL_SUPPLIED)
    encoder = instantiate(node)
    return encoder(
        vocab_size=cfg.task.vocab_size,
        max_length=cfg.task.max_length,
        num_classes=cfg.task.num_classes,
        attention=attention_factory(cfg.attention),
        head=instantiate(cfg.task.head),
    )


def build_module(cfg) -> LRAModule:
    """LightningModule for ``cfg`` (model, AdamW and schedule from their config groups)."""
    from hydra.utils import instantiate

    scheduler = instantiate(cfg.scheduler) if cfg.get("scheduler") else None
    return LRAModule(build_model(cfg), instantiate(cfg.optimizer), scheduler, cfg.task.num_classes, run_settings(cfg),
                     compile_network=compile_setting(cfg))
