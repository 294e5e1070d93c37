"""Linear-attention branches of LiZA (TPTT, Furfaro 2025, §3.1 and §3.3), non-causal for our encoder.

Both modules take ``q, k, v`` ``(B, H, n, d)`` and ``key_mask`` bool ``(B, n)`` and return ``(B, H, n, d)``;
pad tokens (``key_mask`` False) contribute nothing to any output row. Both compute in at least float32
(autocast is disabled inside: the running sums and the triangular solve are unstable in fp16/bf16).

* :class:`EluLinearAttention`: TPTT eq. 3 with ``φ = ELU + 1`` summed over *all* real keys
  (bidirectional), ``O_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j)``. Cost O(n d²). It is also the
  ``linear`` row of the LRA tables on its own (``configs/attention/linear.yaml``): the Linear Transformer of
  Katharopoulos et al. 2020, "Transformers are RNNs", eq. 2 with ``sim(q, k) = φ(q)ᵀφ(k)`` (eq. 4),
  reordered to eq. 5–6, with eq. 7's ``φ(x) = elu(x) + 1``; no 1/√d scaling (the paper has none). The authors'
  code (idiap/fast-transformers ``LinearAttention``) adds ε = 1e-6 to the denominator; we floor it at ε
  instead, which changes nothing while a real key exists (the denominator is a sum of positive terms).
* :class:`DeltaRuleAttention`: the delta rule (DeltaNet, Yang et al. 2024 — TPTT ref. [18]) in its
  chunkwise UT-transform form, run forward and on the reversed sequence and averaged. TPTT's §3.3 equations
  (5)–(6) write the update without the ``−S k`` correction. Its public chunked scan (``tptt`` 0.12.1) does
  apply the correction, but our code review found it is still not the delta rule: within a chunk the output
  is the element-wise ``q ⊙ u`` instead of ``tril(Q Kᵀ) U`` (``o_t = S_t q_t``), and the state handed to the
  next chunk is built from the chunk's last token only, so its output depends on the chunk size (max
  difference 0.83 between chunk sizes 64 and 32 in that review). We compute the delta rule itself, which is
  independent of the chunk size (``tests/attention/test_delta_rule.py``). Cost O(n C d + n d²) for chunk size C,
  memory O(n C) per head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attention.config_checks import check_positive_int
from kernels.common.precision import autocast_off

FLOAT_EPS = 1e-6  # floor of the ELU normaliser (it is a sum of positive terms, > 0 for any real key)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32, or float64 when the inputs are float64."""
    return torch.promote_types(x.dtype, torch.float32)


class EluLinearAttention(nn.Module):
    """Non-causal linear attention with the ELU+1 feature map (Katharopoulos et al. 2020; TPTT eq. 3).

    ``O = (φ(Q) (φ(K)ᵀ V)) / (φ(Q) φ(K)ᵀ 1)``, pads removed by zeroing ``φ(k_j)``; no parameters.
    """

    def __init__(self, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        dtype = compute_dtype(q)
        with autocast_off(q.device.type):
            phi_q = F.elu(q.to(dtype)) + 1.0  # (B, H, n, d)
            phi_k = (F.elu(k.to(dtype)) + 1.0) * key_mask[:, None, :, None]  # pads -> 0
            kv = phi_k.transpose(-1, -2) @ v.to(dtype)  # (B, H, d, d_v)
            normaliser = phi_q @ phi_k.sum(-2).unsqueeze(-1)  # (B, H, n, 1)
            out = (phi_q @ kv) / normaliser.clamp_min(FLOAT_EPS)
        return out.to(q.dtype)


def delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Causal delta rule ``S_t = S_{t−1} + β_t (v_t − S_{t−1} k_t) k_tᵀ``, ``o_t = S_t q_t`` (S₀ = 0), chunkwise.

    Shapes: ``q, k`` ``(B, H, n, d_k)``, ``v`` ``(B, H, n, d_v)``, ``beta`` ``(B, H, n)`` -> ``(B, H, n, d_v)``.
    Within a chunk of C tokens with incoming state S (here ``d_k × d_v``, the transpose of the rule's S), the
    pseudo-values ``U = (I + tril(diag(β) K Kᵀ, −1))⁻¹ (diag(β) V − diag(β) K S)`` (the UT transform; one
    unit-lower-triangular solve per chunk, shared by both terms) give ``O = Q S + tril(Q Kᵀ) U`` and the
    outgoing state ``S + Kᵀ U``. The sequence is zero-padded to a multiple of C (β = 0, k = 0: no effect).
    The only Python loop runs over the n / C chunks.
    """
    if chunk_size < 1:
        raise ValueError(f"attention.linear.chunk_size must be >= 1, got {chunk_size}")
    batch, heads, n, d_k = k.shape
    d_v = v.shape[-1]
    pad = (-n) % chunk_size
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta = F.pad(beta, (0, pad))
    chunks = (n + pad) // chunk_size
    q, k, v = (x.unflatten(2, (chunks, chunk_size)) for x in (q, k, v))  # (B, H, N, C, d)
    k_beta = k * beta.unflatten(2, (chunks, chunk_size)).unsqueeze(-1)
    v_beta = v * beta.unflatten(2, (chunks, chunk_size)).unsqueeze(-1)
    lower = torch.tril(k_beta @ k.transpose(-1, -2), diagonal=-1)  # diagonal is implicit 1 (unitriangular)
    solved = torch.linalg.solve_triangular(lower, torch.cat([v_beta, k_beta], -1), upper=False, unitriangular=True)
    w_v, w_k = solved.split([d_v, d_k], -1)  # U = w_v − w_k S
    scores = torch.tril(q @ k.transpose(-1, -2))  # (B, H, N, C, C), o_t sees tokens ≤ t of its chunk
    state = q.new_zeros(batch, heads, d_k, d_v)
    outputs = []
    # unbind (not indexing in the loop): its backward is one stack, not one zero-filled full-size grad per chunk
    for q_c, k_c, w_v_c, w_k_c, scores_c in zip(*(x.unbind(2) for x in (q, k, w_v, w_k, scores))):
        u = w_v_c - w_k_c @ state  # (B, H, C, d_v)
        outputs.append(q_c @ state + scores_c @ u)
        state = state + k_c.transpose(-1, -2) @ u
    return torch.stack(outputs, 2).flatten(2, 3)[:, :, :n]


class DeltaRuleAttention(nn.Module):
    """Bidirectional delta-rule attention: mean of the causal delta rule forward and on the reversed sequence.

    * Normalisation: ``q`` and ``k`` are L2-normalised per head and token (DeltaNet's choice; it keeps
      ``I − β k kᵀ`` a contraction for β ∈ (0, 1), so the state cannot blow up).
    * ``β_t = sigmoid(⟨w_h, k_t⟩ + b_h)`` from the raw (un-normalised) key of head h: LiZA's only extra
      parameters, ``beta_weight`` ``(H, d)`` initialised to 0 and ``beta_bias`` ``(H,)`` to 0 (β = 0.5 at
      conversion); a softmax checkpoint loads with exactly these two initialised.
    * Padding: ``β = 0`` and ``k = 0`` on pads, so a pad leaves the state unchanged in both directions and
      real rows do not depend on pad content or on where the pads sit. Pad rows are not meaningful.
    """

    def __init__(self, num_heads: int, head_dim: int, chunk_size: int = 64):
        super().__init__()
        self.chunk_size = check_positive_int(chunk_size, "linear.chunk_size")
        self.beta_weight = nn.Parameter(torch.zeros(num_heads, head_dim))
        self.beta_bias = nn.Parameter(torch.zeros(num_heads))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        dtype = compute_dtype(q)
        with autocast_off(q.device.type):
            real = key_mask[:, None, :].to(dtype)  # (B, 1, n)
            logits = torch.einsum("bhnd,hd->bhn", k.to(dtype), self.beta_weight.to(dtype)) + self.beta_bias.to(dtype)[:, None]
            beta = torch.sigmoid(logits) * real  # (B, H, n), 0 on pads
            q_n = F.normalize(q.to(dtype), dim=-1)
            k_n = F.normalize(k.to(dtype), dim=-1) * real.unsqueeze(-1)
            v_c = v.to(dtype)
            both = [torch.cat([x, x.flip(2)]) for x in (q_n, k_n, v_c, beta)]  # forward and reversed, one batch
            forward, backward = delta_rule_chunked(*both, self.chunk_size).chunk(2)
            out = 0.5 * (forward + backward.flip(2))
        return out.to(q.dtype)
