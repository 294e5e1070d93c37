"""Drop-in attention variants.

Every variant is built from its config node (``configs/attention/<name>.yaml``) by
:func:`build_attention` and called as ``attn(q, k, v, key_mask) -> out`` with

* ``q, k, v``: ``(batch, heads, n, head_dim)``
* ``key_mask``: bool ``(batch, n)``, True for real tokens
* ``out``: ``(batch, heads, n, head_dim)``

The projections (``q_proj, k_proj, v_proj, out_proj``) live in
:class:`models.blocks.MultiHeadAttention`, so checkpoints move between variants.
"""

from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

# Keys of an attention config node that describe it but are not constructor arguments.
DESCRIPTIVE_KEYS = ("name",)


def build_attention(cfg: DictConfig, num_heads: int, head_dim: int) -> nn.Module:
    """Instantiate the attention node's ``_target_`` for ``num_heads`` heads of size ``head_dim``.

    The node is a ``_partial_`` factory (see ``configs/attention/*.yaml``); the head layout
    is supplied here because it belongs to the model, not to the attention config.
    """
    if "_target_" not in cfg:
        raise ValueError(
            f"attention config has no _target_ (keys: {sorted(cfg.keys())}); "
            "pick one of configs/attention/*.yaml, e.g. attention=softmax"
        )
    # Resolve against the whole run config first: nodes may interpolate (e.g. ${task.max_length}).
    container = OmegaConf.to_container(cfg, resolve=True)
    node = OmegaConf.create({key: value for key, value in container.items() if key not in DESCRIPTIVE_KEYS})
    factory = instantiate(node, _partial_=True)
    return factory(num_heads=num_heads, head_dim=head_dim)
