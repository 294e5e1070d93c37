"""Nyströmformer's landmarks in the fused forms as one operator forward and one backward (``lra_nystrom::*``).

The segment means of :func:`attention.nystrom.segment_means` (same segments, same decisions) of ``Q`` and ``K``
at once, by the Triton kernels of :mod:`kernels.landmarks` on CUDA tensors (or under the interpreter,
``TRITON_INTERPRET=1``), with what the rest of the fused Nyström needs from them: each segment's additive mask as a
key (0, or :data:`attention.paths.MASKED` for an empty one) and its validity. Each kernel is a ``torch.library``
custom operator with a fake implementation (shapes: the ``meta`` device, ``torch.compile``'s tracing) and its
autograd; one launch forward, one backward, where the attention-call form (:func:`attention.nystrom.fused_segment_means`)
launches about a dozen kernels forward and backward. The kernels take q, k in float32, bf16 or fp16 and return the
means in float32 (m-sized), the token gradients in the inputs' dtype. :func:`landmark_means` picks the form: the
kernels where :func:`kernels.landmarks.launch.takes` the shape, else the attention-call form
(:func:`fused_segment_means`, means in the inputs' dtype: float64, larger tiles, CPU tensors without the interpreter).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import register_flop_formula

from attention import paths
from kernels.common.launch import interpreted
from kernels.landmarks import launch

Tensor = torch.Tensor


@torch.library.custom_op("lra_nystrom::segment_means", mutates_args=())
def _segment_means(q: Tensor, k: Tensor, key_mask: Tensor, m: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor,
                                                                            Tensor]:
    """``(Q̃, K̃, counts, slot mask, valid, segment)``: :func:`kernels.landmarks.launch.segment_means_forward`."""
    return launch.segment_means_forward(q, k, key_mask, m, paths.MASKED)


@_segment_means.register_fake
def _(q, k, key_mask, m):
    batch, heads, n, d = q.shape
    means = [q.new_empty(batch, heads, m, d, dtype=torch.float32) for _ in range(2)]
    per_slot = [q.new_empty(batch, heads, m, dtype=torch.float32) for _ in range(2)]
    return (*means, *per_slot, q.new_empty(batch, heads, m, dtype=torch.bool),
            q.new_empty(batch, heads, n, dtype=torch.int32))


@torch.library.custom_op("lra_nystrom::segment_means_backward", mutates_args=())
def _segment_means_backward(d_q_land: Tensor, d_k_land: Tensor, counts: Tensor, segment: Tensor,
                            dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(dQ, dK)`` in ``dtype`` (the inputs'): :func:`kernels.landmarks.launch.segment_means_backward`."""
    return launch.segment_means_backward(d_q_land, d_k_land, counts, segment, dtype)


@_segment_means_backward.register_fake
def _(d_q_land, d_k_land, counts, segment, dtype):
    shape = (*segment.shape, d_q_land.shape[-1])
    return d_q_land.new_empty(shape, dtype=dtype), d_q_land.new_empty(shape, dtype=dtype)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(output[2], output[5])  # counts, segments
    ctx.dtype = inputs[0].dtype
    ctx.set_materialize_grads(False)


def _grad(ctx, d_q_land, d_k_land, *_):
    counts, segment = ctx.saved_tensors
    if d_q_land is None and d_k_land is None:
        return None, None, None, None
    d_q_land = torch.zeros_like(d_k_land) if d_q_land is None else d_q_land
    d_k_land = torch.zeros_like(d_q_land) if d_k_land is None else d_k_land
    dq, dk = _segment_means_backward(d_q_land.float(), d_k_land.float(), counts, segment, ctx.dtype)
    return dq, dk, None, None


_segment_means.register_autograd(_grad, setup_context=_setup)


@register_flop_formula(torch.ops.lra_nystrom.segment_means)
def _(q, k, key_mask, m, *args, out_shape=None, **kwargs) -> int:
    """The forward kernel's products: per (batch, head) and tensor (Q, K), ``onehotᵀ X`` over all n tokens with
    ``BLOCK_M`` one-hot rows a program (``2·BLOCK_M·n·d``, the tile it multiplies, not the ``n·d`` adds of a mean)."""
    batch, heads, n, d = q
    per = launch.segments_per_program(batch * heads, m, d, launch.TARGET_PROGRAMS)
    block_m = launch.launch_config("_segment_means_fwd", m, d, per).constexprs["BLOCK_M"]
    return 2 * 2 * batch * heads * block_m * n * d


@register_flop_formula(torch.ops.lra_nystrom.segment_means_backward)
def _(*args, out_shape=None, **kwargs) -> int:
    return 0  # a gather and a scale per token: no product


def kernels_run(x: Tensor) -> bool:
    """Whether the kernels can run on ``x``'s device: CUDA, ``meta`` (their fake implementations), or CPU tensors under
    the Triton interpreter."""
    return x.is_cuda or x.device.type == "meta" or (x.device.type == "cpu" and interpreted())


def fused_segment_means(x: torch.Tensor, key_mask: torch.Tensor, key_bias: torch.Tensor,
                        m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`attention.nystrom.segment_means` in the fused forms (:mod:`attention.paths`): the same landmarks ``(B, H, m, d)`` and
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


def landmark_means(q: Tensor, k: Tensor, key_mask: Tensor, m: int):
    """``(Q̃, K̃, slot mask (B, H or 1, 1, m), valid (B, H or 1, m))`` of ``q, k`` ``(B, H, n, d)`` in ``m`` segments:
    the kernels where they run and take the shape, else :func:`fused_segment_means` (with ``key_mask``'s additive
    mask, made only then)."""
    if kernels_run(q) and launch.takes(q, m) and q.stride(-1) == k.stride(-1) == 1:
        q_land, k_land, _, slots, valid, _ = _segment_means(q, k, key_mask, m)
        return q_land, k_land, slots.detach()[:, :, None, :], valid  # a mask: no gradient flows into it
    key_bias = paths.masking_bias(key_mask, q.dtype)[:, None, None, :]  # (B, 1, 1, n)
    landmarks, valid = fused_segment_means(torch.cat([q, k], -1), key_mask, key_bias, m)
    q_land, k_land = landmarks.split(q.shape[-1], -1)
    return q_land, k_land, paths.masking_bias(valid, q.dtype)[:, None, None, :], valid[:, None]
