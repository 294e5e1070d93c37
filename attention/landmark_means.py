"""Nyströmformer's landmarks in the fused forms: the choice between the kernels' operator and the attention-call form.

The segment means of :func:`attention.nystrom.segment_means` (same segments, same decisions) of ``Q`` and ``K``
at once, with what the rest of the fused Nyström needs from them: each segment's additive mask as a key (0, or
:data:`attention.paths.MASKED` for an empty one) and its validity. :func:`landmark_means` runs the form :mod:`attention.impl` gives it: the
Triton kernels of :mod:`kernels.segment_means` as the custom operators ``lra_nystrom::*`` of
:mod:`kernels.segment_means.ops` (one launch forward, one backward; q, k in float32, bf16 or fp16, the means in float32,
the token gradients in the inputs' dtype) where :func:`kernels.segment_means.ops.takes` the inputs (CUDA tensors, or CPU
ones under the interpreter, ``TRITON_INTERPRET=1``), else the attention-call form :func:`fused_segment_means` (about
a dozen kernels forward and backward; means in the inputs' dtype: float64, larger tiles, CPU tensors without the
interpreter).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attention import paths
from kernels.segment_means import ops

Tensor = torch.Tensor


def fused_segment_means(x: torch.Tensor, key_mask: torch.Tensor, key_bias: torch.Tensor,
                        m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`attention.nystrom.segment_means` in the ``fused`` form (:mod:`attention.impl`): the same landmarks ``(B, H, m, d)`` and
    validity ``(B, m)``, the means as one fused attention call: attention with equal scores (``scale = 0``) over the
    keys its mask lets through is their mean, so ``SDPA(·, x, x, scale=0, mask = the segment's real tokens)``
    averages each segment (its gradient spreads ``dX̃_s / count_s`` over the segment's tokens). ``key_bias``: the
    additive mask of ``key_mask`` (:func:`attention.paths.masking_bias`), ``(B, 1, 1, n)``.

    A pad's running count of real tokens is that of the real token before it, so it falls in that token's segment
    (or none, before the first real token): which segments hold a real token can be read off the unmasked segment
    numbers, and the pads leave the means through ``key_bias``."""
    rank = key_mask.cumsum(-1)  # (B, n): 1..n_real on real tokens
    n_real = rank[:, -1:].clamp_min(1)
    segment = torch.div((rank - 1) * m, n_real, rounding_mode="floor")  # (B, n)
    members = segment[:, None, :] == paths.positions(m, x.device)[:, None]  # (B, m, n)
    bias = torch.where(members[:, None], key_bias, paths.MASKED)  # (B, 1, m, n)
    means = F.scaled_dot_product_attention(x.detach()[:, :, :m], x.detach(), x, attn_mask=bias, scale=0.0)
    return means, members.any(-1)


def landmark_means(q: Tensor, k: Tensor, key_mask: Tensor, m: int, form: str = "triton"):
    """``(Q̃, K̃, slot mask (B, H or 1, 1, m), valid (B, H or 1, m))`` of ``q, k`` ``(B, H, n, d)`` in ``m`` segments:
    in ``form`` ``triton`` the kernels where they run and take the shape (:func:`kernels.segment_means.ops.takes`), else
    (and in ``form`` ``pytorch``) :func:`fused_segment_means` (with ``key_mask``'s additive mask, made only then)."""
    if form == "triton" and ops.takes(q, k, m):
        q_land, k_land, _, slots, valid, _ = ops.segment_means(q, k, key_mask, m, paths.MASKED)
        return q_land, k_land, slots.detach()[:, :, None, :], valid  # a mask: no gradient flows into it
    key_bias = paths.masking_bias(key_mask, q.dtype)[:, None, None, :]  # (B, 1, 1, n)
    landmarks, valid = fused_segment_means(torch.cat([q, k], -1), key_mask, key_bias, m)
    q_land, k_land = landmarks.split(q.shape[-1], -1)
    return q_land, k_land, paths.masking_bias(valid, q.dtype)[:, None, None, :], valid[:, None]
