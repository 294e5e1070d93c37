"""Nyströmformer's landmarks as ``torch.library`` custom ops (``lra_nystrom::*``): one launch forward, one backward.

``segment_means(q, k, key_mask, m, masked)`` runs :func:`kernels.segment_means.launch.segment_means_forward` (the
segment means of ``Q`` and ``K`` at once, each segment's count, its additive mask as a key, 0 or ``masked`` for an
empty one, its validity, each token's segment); ``segment_means_backward`` the backward kernel, registered as its
autograd formula. Both have fake implementations (shapes: the ``meta`` device, ``torch.compile``'s tracing) and FLOP
formulas. The kernels take q, k in float32, bf16 or fp16 and return the means in float32 (m-sized), the token
gradients in the inputs' dtype. :func:`takes` says whether they run on given inputs (device, dtype, tile, strides);
:func:`attention.landmark_means.landmark_means` takes them there and its attention-call form elsewhere. The plain
PyTorch reference: :mod:`kernels.segment_means.naive`.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import register_flop_formula

from kernels.common.launch import runs_interpreted
from kernels.segment_means import launch

Tensor = torch.Tensor


@torch.library.custom_op("lra_nystrom::segment_means", mutates_args=())
def segment_means(q: Tensor, k: Tensor, key_mask: Tensor, m: int, masked: float) -> tuple[Tensor, Tensor, Tensor,
                                                                                          Tensor, Tensor, Tensor]:
    """``(Q̃, K̃, counts, slot mask, valid, segment)``: :func:`kernels.segment_means.launch.segment_means_forward`."""
    return launch.segment_means_forward(q, k, key_mask, m, masked)


@segment_means.register_fake
def _(q, k, key_mask, m, masked):
    batch, heads, n, d = q.shape
    means = [q.new_empty(batch, heads, m, d, dtype=torch.float32) for _ in range(2)]
    per_slot = [q.new_empty(batch, heads, m, dtype=torch.float32) for _ in range(2)]
    return (*means, *per_slot, q.new_empty(batch, heads, m, dtype=torch.bool),
            q.new_empty(batch, heads, n, dtype=torch.int32))


@torch.library.custom_op("lra_nystrom::segment_means_backward", mutates_args=())
def segment_means_backward(d_q_land: Tensor, d_k_land: Tensor, counts: Tensor, segment: Tensor,
                           dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(dQ, dK)`` in ``dtype`` (the inputs'): :func:`kernels.segment_means.launch.segment_means_backward`."""
    return launch.segment_means_backward(d_q_land, d_k_land, counts, segment, dtype)


@segment_means_backward.register_fake
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
        return None, None, None, None, None
    d_q_land = torch.zeros_like(d_k_land) if d_q_land is None else d_q_land
    d_k_land = torch.zeros_like(d_q_land) if d_k_land is None else d_k_land
    dq, dk = segment_means_backward(d_q_land.float(), d_k_land.float(), counts, segment, ctx.dtype)
    return dq, dk, None, None, None


segment_means.register_autograd(_grad, setup_context=_setup)


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
    return x.is_cuda or x.device.type == "meta" or runs_interpreted(x.device)


def takes(q: Tensor, k: Tensor, m: int) -> bool:
    """Whether :func:`segment_means` runs on ``q, k`` ``(B, H, n, d)`` in ``m`` segments: a device the kernels run on
    (:func:`kernels_run`), a dtype and tile they take (:func:`kernels.segment_means.launch.takes`), unit last strides."""
    return kernels_run(q) and launch.takes(q, m) and q.stride(-1) == k.stride(-1) == 1
