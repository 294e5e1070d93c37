"""DBA: dynamic bilinear low-rank attention (Qin, Li, Tang and Zhuang 2022, "DBA: Efficient Transformer with Dynamic
Bilinear Low-Rank Attention", arXiv 2211.16368; the authors' code: BrightQin/DBA-Time-Series,
``src/models/ts_transformer.py``, class ``dba_attention``).

The n tokens are compressed to r by an input-dependent ("dynamic") matrix ``P``, attention runs among the r
compressed tokens in a reduced hidden dimension d_p ("bilinear": both the length and the hidden size are cut), and
an input-dependent ``r``-column matrix ``L`` spreads the result back over the n tokens. Per head h, with
``d = head_dim``, ``d_p' = d_p / heads`` (``hidden_dim`` d_p over all heads, the authors' ``middle_dim``):

* compress:    ``P_h = softmax(E_h (X W_pk)_hᵀ / √d_p' + pad mask)``          ``(r, n)``, rows sum to 1 over real tokens
               ``C_h = P_h V_h``                                           ``(r, d)``; ``C = [C_h]_h`` ``(r, D)``
* attend:      ``Z_h = softmax((C W_q)_h (C W_k)_hᵀ / √d_p') (C W_v)_h``   ``(r, d)``, ``(C W_q)_h`` ``(r, d_p')``
               ``Z = LayerNorm([Z_h]_h)``                                   ``(r, D)``
* decompress:  ``L = softmax_r((X W_len)_h)``                              ``(n, r)`` per head;  ``Y_h = L_h Z_h``

(every ``W`` with a bias), then ``out_proj``. Cost O(n r (d_p + D) + r² D) time, O(n r) memory: linear in n.

How it fills one attention slot ``attend(q, k, v, key_mask)`` (``models/blocks.MultiHeadAttention`` owns
``q_proj, k_proj, v_proj, out_proj``): the authors compute ``pk_proj(x)``, ``pv_proj(x)``, ``q_len_proj(x)`` from the
layer input; here ``V`` is the block's ``v = v_proj(x)`` (``pv_proj``: any D × D map), ``X W_pk`` is ``k`` (heads
side by side, ``(n, D)``) times a ``D × d_p`` layer, and ``X W_len`` is ``q`` times a ``D × (heads·r)`` layer: maps of
``k_proj(x)``, ``q_proj(x)``, the same function class as maps of ``x`` while those projections are invertible. The
compression queries ``E_h`` ``(r, d_p')`` are learned per layer (the authors' ``pq_proj(px)``).

What the paper's text could have pinned and we could not read (only its abstract was reachable here; the equations
above are the authors' code's), and what we chose:

* the authors' code passes the compressed sequence ``C`` of one layer to the next as its ``px`` (a sequence carried
  between layers, as Luna's); here each layer learns its own ``E`` (a per-layer slot cannot carry state), so the
  compression queries do not depend on the input, only ``P``'s keys do;
* the LRA settings (r, d_p) of the paper's Table (copied into CUR Table 1) are not known to us; defaults r = 128
  (the projection size the Proxyformer table uses for every projection-based row) and d_p = 32 (half of our
  d_model 64; the authors' time-series code fixes ``middle_dim = 24``, ``proj_len = 16``);
* no attention dropout (the authors' code has three; no variant here has one); ``E`` drawn N(0, d_p^{-1}) (the
  authors draw ``px`` N(0, D^{-1})).

Exact limit: no choice of r gives softmax attention (``P`` and ``L`` are softmaxes, never an identity). What the
maths gives exactly, and the test checks: with r = 1 every token gets the same output,
``LayerNorm(W_v (Σ_j p_j v_j) + b_v)`` with ``p = softmax_j(E (X W_pk)_jᵀ/√d_p')`` (one pooled token); and, having no
positional parameter, DBA is permutation-equivariant: permuting the real tokens permutes the outputs.

Padding: pads enter only as keys of ``P`` (masked; the one contraction over n), ``L`` is per token, so appending pads
changes no real token's output. A sequence with no real token has no key in ``P`` (its outputs are undefined, as in
softmax attention).

The two attentions are fused softmax-attention calls (``F.scaled_dot_product_attention``; PyTorch's flash kernel on
CPU), so the ``(r, n)`` matrix ``P`` is never stored; ``L`` ``(n, r)`` is (its softmax is over r, not a key axis).

Shapes: ``q, k, v`` ``(B, H, n, d)``, ``key_mask`` bool ``(B, n)`` -> ``(B, H, n, d)``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from attention.config_checks import check_positive_int


class DBAAttention(nn.Module):
    """Dynamic compression to r tokens, attention among them in hidden size d_p, dynamic decompression (see the
    module docstring)."""

    no_attention_matrix = ("attention=dba has no per-head n x n attention matrix (the r compressed tokens mix every "
                           "head through W_q, W_k, W_v and a LayerNorm): diagnostics that need one do not apply to it")

    def __init__(self, num_heads: int, head_dim: int, proj_len: int = 128, hidden_dim: int = 32):
        super().__init__()
        check_positive_int(proj_len, "proj_len")
        check_positive_int(hidden_dim, "hidden_dim")
        if hidden_dim % num_heads:
            raise ValueError(f"attention.hidden_dim must be divisible by model.num_heads = {num_heads} (each head "
                             f"gets hidden_dim / num_heads columns), got {hidden_dim}")
        self.num_heads, self.head_dim, self.proj_len = num_heads, head_dim, proj_len
        self.low_dim = hidden_dim // num_heads  # d_p'
        d_model = num_heads * head_dim
        self.compress_queries = nn.Parameter(torch.randn(num_heads, proj_len, self.low_dim) * hidden_dim**-0.5)  # E
        self.compress_keys = nn.Linear(d_model, hidden_dim)  # W_pk
        self.q_low = nn.Linear(d_model, hidden_dim)  # W_q
        self.k_low = nn.Linear(d_model, hidden_dim)  # W_k
        self.v_low = nn.Linear(d_model, d_model)  # W_v
        self.norm = nn.LayerNorm(d_model)
        self.decompress = nn.Linear(d_model, num_heads * proj_len)  # W_len

    def heads(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """``(B, n, H·width)`` -> ``(B, H, n, width)``."""
        return x.unflatten(-1, (self.num_heads, width)).transpose(1, 2)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        d, low, r = self.head_dim, self.low_dim, self.proj_len
        keys = self.heads(self.compress_keys(k.transpose(1, 2).flatten(2)), low)  # (B, H, n, d_p')
        queries = self.compress_queries.to(keys.dtype).expand(k.shape[0], -1, -1, -1)  # (B, H, r, d_p'): E
        c = F.scaled_dot_product_attention(queries, keys, v, attn_mask=key_mask[:, None, None, :])  # (B, H, r, d): P V
        c = c.transpose(1, 2).flatten(2)  # (B, r, D): C
        qc, kc, vc = self.heads(self.q_low(c), low), self.heads(self.k_low(c), low), self.heads(self.v_low(c), d)
        z = F.scaled_dot_product_attention(qc, kc, vc)  # (B, H, r, d), scale 1/√d_p'
        z = self.heads(self.norm(z.transpose(1, 2).flatten(2)), d)  # LayerNorm over the concatenated heads
        spread = self.heads(self.decompress(q.transpose(1, 2).flatten(2)), r).softmax(-1)  # (B, H, n, r): L
        return spread @ z
