"""Drop-in attention variants.

Every variant is a module built as ``factory(num_heads=..., head_dim=...)``, where ``factory`` is its
config node (``configs/attention/<name>.yaml``, ``_partial_: true``) instantiated once by the runtime
(:func:`lra.module.attention_factory`), and called as ``attn(q, k, v, key_mask) -> out`` with

* ``q, k, v``: ``(batch, heads, n, head_dim)``
* ``key_mask``: bool ``(batch, n)``, True for real tokens
* ``out``: ``(batch, heads, n, head_dim)``

The projections (``q_proj, k_proj, v_proj, out_proj``) live in
:class:`models.blocks.MultiHeadAttention`, so checkpoints move between variants.
"""

from __future__ import annotations
