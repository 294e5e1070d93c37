"""Set Transformer's induced set attention (Lee et al., ICML 2019, "Set Transformer", §3.2, eqs. 6-10; the
authors' code: juho-lee/set_transformer ``modules.py``, classes ``MAB`` and ``ISAB``).

The paper's blocks: ``MAB(X, Y) = LayerNorm(H + rFF(H))``, ``H = LayerNorm(X + Multihead(X, Y, Y))`` (eqs. 6-7),
and with m learned inducing points ``I ∈ R^{m × D}``: ``ISAB_m(X) = MAB(X, H)``, ``H = MAB(I, X) ∈ R^{m × D}``
(eqs. 9-10): m points attend over the n tokens, then the tokens attend over the m results, O(n m d).
The authors' ``MAB.forward(Q, K)`` computes, per head ``h`` of ``d = D / heads`` columns,
``O = [Q_h + softmax(Q_h K_hᵀ / √D) V_h]_h`` (heads concatenated), ``MAB = O + relu(fc_o(O))``, the LayerNorms
optional (``ln=False`` by default), with ``Q = fc_q(Q)``, ``K = fc_k(K)``, ``V = fc_v(K)``.

How ISAB fills one attention slot ``attend(q, k, v, key_mask)`` of a pre-LN Transformer block
(``models/blocks.MultiHeadAttention`` owns ``q_proj, k_proj, v_proj, out_proj``):

* stage 1, ``H = MAB(I, X)`` in full (:meth:`SetTransformerAttention.induce`): ``k, v`` are MAB(I, X)'s
  ``fc_k(X), fc_v(X)`` (the block's ``k_proj, v_proj``); the inducing points are learned directly in the projected
  space, ``I' = fc_q(I)`` ``(m, D)`` split into heads ``(H, m, d)`` (any I' is some fc_q(I): the same function
  class, one matrix fewer); ``O = I' + softmax(I' Kᵀ/√d) V`` per head, heads concatenated, and
  ``H = O + relu(O W_o + b_o)`` (its ``fc_o``, a ``D × D`` layer across heads);
* stage 2, ``MAB(X, H)``'s attention: ``Y = softmax(Q (H W_k + b_k)ᵀ/√d) (H W_v + b_v)`` per head (its ``fc_k``,
  ``fc_v``: ``D × D`` layers across heads, here; its ``fc_q(X)`` is the block's ``q_proj``). MAB(X, H)'s residual
  ``Q +`` and its ``rFF`` are the block's own residual and feed-forward (after ``out_proj``), so they are not
  repeated here.

Choices against the authors' code: the scale is ``1/√d`` (head size, as the paper's eq. 1 and every variant
here) where ``MAB`` divides by ``√D``, a temperature the projections can absorb; no LayerNorm (``ln=False``, the
code's default; the block is pre-LN); ``I'`` is drawn Xavier-uniform over ``(m, D)`` as the code draws ``I``.

Exact limit: none for the output. Stage 2 attends to m learned summaries of the sequence, so no choice of m
makes ``Y`` equal ``softmax(QKᵀ/√d) V``. What does hold exactly: with the inducing points replaced by the
queries (m = n, ``I' = Q``), stage 1's attention term ``O − I'`` *is* softmax attention, ``softmax(QKᵀ/√d) V``
(the test checks :meth:`induce` so).

Padding: pad keys are masked out of stage 1 (the only place the n tokens are contracted); stage 2 attends over
the m inducing results, which pads never reach, so appending pads changes no real token's output. A sequence
with no real token has no key in stage 1 (its outputs are undefined, as in softmax attention).

Both stages are fused softmax-attention calls (``F.scaled_dot_product_attention``; on CPU PyTorch's flash kernel,
faster than the same maths as matmul + softmax: docs/bench.md), so neither the ``(m, n)`` nor the ``(n, m)``
weights are stored.

Shapes: ``q, k, v`` ``(B, H, n, d)``, ``key_mask`` bool ``(B, n)`` -> ``(B, H, n, d)``. Cost O(n m D) time,
O(n m) memory. Default m = 128 (Proxyformer Table 1's "Set Transformer-ISAB-128").
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from attention.config_checks import check_positive_int


class SetTransformerAttention(nn.Module):
    """ISAB in one attention slot: m learned inducing points summarise the keys/values (``MAB(I, X)``), the queries
    attend over the m summaries (see the module docstring)."""

    no_attention_matrix = ("attention=set_transformer has no per-head n x n attention matrix (the queries attend over "
                           "MAB(I, X), whose keys and values are nonlinear in V): diagnostics that need one do not "
                           "apply to it")

    def __init__(self, num_heads: int, head_dim: int, num_inducing: int = 128):
        super().__init__()
        check_positive_int(num_inducing, "num_inducing")
        self.num_heads, self.head_dim = num_heads, head_dim
        d_model = num_heads * head_dim
        inducing = torch.empty(num_inducing, d_model)
        nn.init.xavier_uniform_(inducing)
        self.inducing = nn.Parameter(inducing.unflatten(-1, (num_heads, head_dim)).transpose(0, 1))  # (H, m, d): I'
        self.rff = nn.Linear(d_model, d_model)  # MAB(I, X)'s fc_o
        self.k_induced = nn.Linear(d_model, d_model)  # MAB(X, H)'s fc_k
        self.v_induced = nn.Linear(d_model, d_model)  # MAB(X, H)'s fc_v

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, m, D)`` -> ``(B, H, m, d)``."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def induce(self, inducing: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor):
        """Stage 1: ``(O, H)``, both ``(B, m, D)``: ``O = I' + softmax(I' Kᵀ/√d) V`` (heads concatenated) and
        ``H = O + relu(fc_o(O))`` for inducing points ``inducing`` ``(H, m, d)`` or ``(B, H, m, d)``."""
        inducing = inducing.expand(k.shape[0], *inducing.shape[-3:])
        attended = F.scaled_dot_product_attention(inducing, k, v, attn_mask=key_mask[:, None, None, :])  # (B, H, m, d)
        out = (inducing + attended).transpose(1, 2).flatten(2)  # (B, m, D)
        return out, out + F.relu(self.rff(out))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        _, induced = self.induce(self.inducing.to(q.dtype), k, v, key_mask)  # (B, m, D): H = MAB(I, X)
        keys, values = self.heads(self.k_induced(induced)), self.heads(self.v_induced(induced))  # (B, H, m, d)
        return F.scaled_dot_product_attention(q, keys, values)  # softmax(Q keysᵀ/√d) values: (B, H, n, d)
