"""Drop-in attention variants.

Every variant is a module built as ``factory(num_heads=..., head_dim=...)``, where ``factory`` is its
config node (``configs/attention/<name>.yaml``, ``_partial_: true``) instantiated once by the runtime
(:func:`lra.build.attention_factory`), and called as ``attn(q, k, v, key_mask) -> out`` with

* ``q, k, v``: ``(batch, heads, n, head_dim)``
* ``key_mask``: bool ``(batch, n)``, True for real tokens
* ``out``: ``(batch, heads, n, head_dim)``

The projections (``q_proj, k_proj, v_proj, out_proj``) live in
:class:`models.blocks.MultiHeadAttention`, so checkpoints move between variants.

Which file is which (each variant's config: ``configs/attention/<name>.yaml``):

Variants
    ``softmax``       exact softmax attention (SDPA; ``softmax_materialised`` stores the n×n weights)
    ``cur``           CURformer: selected rows and columns, ``C U⁺ R``
    ``flashcur``      FlashCURformer: CUR in Triton kernels (:mod:`kernels.cur`)
    ``nystrom``       Nyströmformer: segment-mean landmarks, ``k1 k2⁺ k3``
    ``l1``            exact L1-distance attention (EcoTransformer); ``l1_cur`` is ``cur`` with its score
    ``proxyformer``   Proxyformer's per-head maths (its block: :mod:`models.proxyformer`)
    ``mega``          MEGA's single-head core, exact or CUR-approximated (MegaCUR; its block: :mod:`models.mega`)
    ``liza``          LiZA: softmax and linear attention mixed by a scheduled memory gate
    ``performer``     Performer: FAVOR+, softmax estimated with positive orthogonal random features
    ``linformer``     Linformer: keys and values projected along the sequence, n -> k
    ``local``         LRA's local attention: softmax within non-overlapping blocks
    ``sparse_transformer``  Sparse Transformer's fixed / strided patterns (as LRA: a mask on dense softmax)
    ``orthoformer``   Orthoformer: greedily most-orthogonal query landmarks, ``softmax(Q Lᵀ) softmax(L Kᵀ) V``
    ``reformer``      Reformer: LSH attention with shared QK, bucket-sorted chunks over n_hashes rounds
    ``bigbird``       BigBird: block-sparse softmax over a 3-block window, 2 global blocks and r random blocks
    ``luna``          Luna's pack and unpack per head (its layers, which carry the sequence P: :mod:`models.luna`)
    ``set_transformer``  Set Transformer's ISAB: learned inducing points summarise the keys/values, the queries
                      attend to them
    ``dba``           DBA: dynamic low-rank compression n -> r, attention in a reduced hidden size, spread back

Shared parts of the maths
    ``scores``        score functions (softmax, L1) that the approximations take
    ``selection``     CUR's row and column selection rules
    ``pinv``          the iterative pseudo-inverse (the method and its checks; its kernels: :mod:`kernels.pinv`)
    ``linear``        LiZA's linear branches (ELU feature map, chunked delta rule); the ELU one is also the
                      ``linear`` row of the LRA tables (Linear Transformer)
    ``window``        sliding-window softmax, LiZA's linear-cost base
    ``impl``          ``attention.impl``: the forms (pytorch, cpu, fused, triton), the one table of which code runs
                      each op per variant, device and dtype, and what ``auto`` picks
    ``paths``         what the landmark forms share: the masked score, constants made once, a product with its rows
    ``landmark_stages``  the fused forms' n-sized stages as split-K GEMMs (CUR, Nyström)
    ``landmark_means``   the fused Nyström's landmarks (the kernel op of :mod:`kernels.segment_means`, or PyTorch)
    ``config_checks`` the config-value checks every variant runs at construction

Kernels, their ``torch.library`` ops and autograd wrappers, and their plain PyTorch references (``naive.py``)
live in :mod:`kernels`; the modules here call the ops.
"""

from __future__ import annotations
