"""CUR attention with the softmax or the L1 score, trained on the CPU kernels of :mod:`kernels.landmark_attention` as
one autograd node (docs/bench.md "CUR's backward without full-size copies"); the method: :mod:`attention.cur`, the
plain PyTorch reference: :mod:`kernels.cur.naive`.

Same equations and values as :func:`attention.cur.cur_attention` (its module doc): ``R V`` by the few-queries
kernel, ``U = C[I]`` and ``W = U⁺ (R V)`` by PyTorch (``m × m``), ``Y = C W`` by the few-keys kernel, then
``Y[I] = R V``. What differs is the backward's memory traffic. Taken apart, autograd adds the gradient of the
rows ``Q_I`` (``K_J``) to that of the whole ``Q`` (``K``) in a fresh ``n × d`` tensor, and the backward of the
row overwrite copies the ``n × d`` gradient of ``Y`` to zero its rows ``I``. Here the row gradients are added in
place into the ``dQ`` and ``dK`` the kernels have just written (``scatter_add_``), and the few-keys backward
reads the rows ``I`` of ``dY`` as 0 (``zero_rows``) instead of a zeroed copy: per training step, four
``n × d`` copies fewer (three in the backward, and the forward's out-of-place overwrite), no change in the
result beyond summation order.

The ``m × m`` middle (``U``, the pseudo-inverse, ``W``) is recorded by autograd during the forward on detached
copies of ``Q_I``, ``K_J``, ``R V`` and differentiated with ``torch.autograd.grad`` in the backward; the method
passes in its score and its pseudo-inverse (kernels import no method). Backend, chosen once by :func:`takes`: used
by :func:`attention.cur.cur_attention` when gradients are wanted and :func:`takes` the operands; the no-grad
forward already overwrites in place.
"""

from __future__ import annotations

from typing import Callable

import torch

from kernels.common.rows import gather_rows
from kernels.landmark_attention import cpu as landmarks


def takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: int) -> bool:
    """Whether both landmark products of CUR on ``q, k, v`` ``(B, H, n, d)`` with ``m`` landmarks run by the
    kernels, forward and backward (float32 CPU rows, ``d`` a multiple of the vector width, ``m ≤ 128``)."""
    return (landmarks.kernel_takes(q, k, v)  # first: False under torch.compile, nothing else traced
            and m <= landmarks.MAX_KEYS and q.shape[-1] % landmarks.vector_floats() == 0
            and landmarks.backward_library() is not None)


class CURKernelAttention(torch.autograd.Function):
    """``cur_attention``'s fused path as one node (module doc); float32 ``(B, H, n, d)`` operands, bool ``valid_q``,
    ``valid_k`` ``(B, H, m)``: whether each selected row is a real token; ``score`` has ``kernel_form`` (the
    kernels' scale and whether they score by L1 distance: :class:`attention.scores.SoftmaxScore`, ``L1Score``);
    ``pinv`` maps ``U`` ``(B, H, m, m)`` to ``U⁺`` (:func:`attention.pinv.iterative_pinv` with CUR's iterations)."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, index_q, index_k, valid_q, valid_k, score,
                pinv: Callable[[torch.Tensor], torch.Tensor], overwrite_rows: bool):
        batch, heads, n, d = q.shape
        m = index_q.shape[-1]
        scale, l1 = score.kernel_form(d)
        key_bias = landmarks.key_bias(key_mask[:, None, None, :], batch, heads, n, q)  # (B, 1, 1, n)
        landmark_bias = landmarks.key_bias(valid_k[:, :, None, :], batch, heads, m, q)  # (B, H, 1, m)
        q_rows, k_rows = gather_rows(q, index_q), gather_rows(k, index_k)
        rv, rv_max, rv_sum = landmarks.few_queries_forward(q_rows, k, v, key_bias, scale, l1)  # R V (B, H, m, d)
        with torch.enable_grad():  # the m × m middle, differentiated in backward
            middle = [x.detach().requires_grad_() for x in (q_rows, k_rows, rv)]
            c_rows = score(middle[0], middle[1], valid_k[:, :, None, :], index_q, index_k)  # U = C[I]
            eye = torch.eye(m, dtype=q.dtype, device=q.device)
            w = pinv(torch.where(valid_q[..., None], c_rows, eye)) @ middle[2]
        y, y_max, y_sum = landmarks.few_keys_forward(q, k_rows, w.detach(), landmark_bias, scale, l1)  # C W
        if overwrite_rows:
            y.scatter_(2, index_q[..., None].expand_as(rv), rv)
        ctx.save_for_backward(q, k, v, q_rows, k_rows, rv, y, y_sum.log_().add_(y_max), rv_sum.log_().add_(rv_max),
                              key_bias, landmark_bias, index_q, index_k)
        ctx.middle, ctx.w, ctx.scale, ctx.l1, ctx.overwrite_rows = middle, w, scale, l1, overwrite_rows
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        q, k, v, q_rows, k_rows, rv, y, y_lse, rv_lse, key_bias, landmark_bias, index_q, index_k = ctx.saved_tensors
        grad = grad if grad.stride(-1) == 1 else grad.contiguous()  # e.g. the expanded gradient of a sum
        rows_q = index_q[..., None].expand_as(q_rows)
        zero_rows = index_q if ctx.overwrite_rows else None  # overwritten rows: no gradient through C W
        dq, dk_rows, dw = landmarks.few_keys_backward(grad, q, k_rows, ctx.w, landmark_bias, y, y_lse,
                                                          ctx.scale, ctx.l1, zero_rows)
        dq_rows, dk_rows_middle, drv = torch.autograd.grad(ctx.w, ctx.middle, dw, retain_graph=True)  # as ctx's
        if ctx.overwrite_rows:
            drv += grad.gather(2, rows_q)
        dq_rows_rv, dk, dv = landmarks.few_queries_backward(drv, q_rows, k, v, key_bias, rv, rv_lse, ctx.scale,
                                                                ctx.l1)
        dq.scatter_add_(2, rows_q, dq_rows.add_(dq_rows_rv))
        dk.scatter_add_(2, index_k[..., None].expand_as(k_rows), dk_rows.add_(dk_rows_middle))
        return dq, dk, dv, *[None] * 8
