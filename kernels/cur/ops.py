"""The FlashCUR kernels as ``torch.library`` custom ops (``lra_flashcur::*``): one dispatcher op per kernel (pair)
of :mod:`kernels.cur.run`, a fake implementation (shapes and dtypes only) that serves the ``meta`` device and
``torch.compile``'s tracing, the autograd formulas registered on the forward ops (the backward ops run under
no_grad: no double backward), and a FLOP formula per op for ``torch.utils.flop_counter`` (which cannot see inside
the kernels: :data:`PRODUCTS`). :mod:`attention.flashcur` chains them (with ``W = pinv(U) RV`` in PyTorch between
kernels b and c); the plain PyTorch reference they are tested against is :mod:`kernels.cur.naive`.

* ``rv_forward(q_sel, k, v, key_mask) -> (RV, lse)`` (kernel a) and its backward ``rv_backward``;
* ``u_forward(q_sel, k_sel, valid_k) -> U`` (kernel b; its m × m backward in PyTorch, here);
* ``out_forward(q, k_sel, valid_k, w, rv, slot, index_q, overwrite_rows) -> (Y, lse)`` (kernel c) and its
  backward ``out_backward`` (the ``C W`` part; rows ``I`` of ``Y`` are ``RV``, whose gradient is gathered here).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import register_flop_formula

from kernels.common.precision import autocast_off
from kernels.common.rows import gather_rows, token_major
from kernels.cur import run

Tensor = torch.Tensor

# Matrix products (each n × m × d, i.e. 2·n·m·d FLOPs per sequence and head) the kernels of each op run, for
# ``torch.utils.flop_counter`` (registered below): rv_forward: scores, P·V; out_forward:
# scores, P·W; rv_backward: _rv_bwd_kv (scores, Pᵀ·dRV, V·dRVᵀ, dSᵀ·Q_I) + _rv_bwd_q (scores, dRV·Vᵀ, dS·K);
# out_backward: _out_bwd_q (scores, dY·Wᵀ, dS·K_J; Δ from the saved output) + _out_bwd_kw (scores, Pᵀ·dY, W·dYᵀ,
# dSᵀ·Q). u_forward runs one m × m × d product (scores).
PRODUCTS = {"rv_forward": 2, "out_forward": 2, "rv_backward": 4 + 3, "out_backward": 3 + 4}


def flops(op: str, batch_heads: int, n: int, m: int, d: int) -> int:
    """Matmul FLOPs (2 per multiply-add, the ``flop_counter`` convention) of FlashCUR op ``op`` on ``batch_heads``
    sequences × heads of ``n`` tokens, ``m`` slots, head_dim ``d``: ``2·PRODUCTS[op]·n·m·d`` per sequence and head;
    ``u_forward``: ``2·m·m·d``."""
    if op == "u_forward":
        return 2 * batch_heads * m * m * d
    return 2 * PRODUCTS[op] * batch_heads * n * m * d




@torch.library.custom_op("lra_flashcur::rv_forward", mutates_args=())
def rv_forward(q_sel: Tensor, k: Tensor, v: Tensor, key_mask: Tensor) -> tuple[Tensor, Tensor]:
    """``RV = softmax(s·Q_I Kᵀ + pad mask) V`` (kernel a) -> ``(RV, lse)``, float32 ``(B,H,m,d)``, ``(B,H,m)``."""
    return run.rv_forward(q_sel, k, v, key_mask)


@rv_forward.register_fake
def _(q_sel, k, v, key_mask):
    return q_sel.new_empty(q_sel.shape, dtype=torch.float32), q_sel.new_empty(q_sel.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("lra_flashcur::rv_backward", mutates_args=())
def rv_backward(q_sel: Tensor, k: Tensor, v: Tensor, key_mask: Tensor, rv: Tensor, lse: Tensor,
                d_rv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Kernel (a)'s tiled backward -> ``(dQ_I, dK, dV)``: ``dQ_I`` float32 (m×d), ``dK, dV`` in the inputs' dtype."""
    return run.rv_backward(q_sel, k, v, key_mask, rv, lse, d_rv)


@rv_backward.register_fake
def _(q_sel, k, v, key_mask, rv, lse, d_rv):
    return q_sel.new_empty(q_sel.shape, dtype=torch.float32), k.new_empty(k.shape), v.new_empty(v.shape)


def _rv_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, *output)
    ctx.set_materialize_grads(False)  # lse has no gradient: no zeros made for it


def _rv_grad(ctx, d_rv, d_lse):
    q_sel, k, v, key_mask, rv, lse = ctx.saved_tensors
    dq_sel, dk, dv = rv_backward(q_sel, k, v, key_mask, rv, lse, d_rv)
    return dq_sel.to(q_sel.dtype), dk.to(k.dtype), dv.to(v.dtype), None


rv_forward.register_autograd(_rv_grad, setup_context=_rv_setup)


@torch.library.custom_op("lra_flashcur::u_forward", mutates_args=())
def u_forward(q_sel: Tensor, k_sel: Tensor, valid_k: Tensor) -> Tensor:
    """``U = softmax(s·Q_I K_Jᵀ)`` over valid key slots (kernel b), float32 ``(B,H,m,m)``; m×m backward in PyTorch."""
    return run.u_forward(q_sel, k_sel, valid_k)


@u_forward.register_fake
def _(q_sel, k_sel, valid_k):
    return q_sel.new_empty(*q_sel.shape[:-1], k_sel.shape[-2], dtype=torch.float32)


def _u_setup(ctx, inputs, output):
    q_sel, k_sel, _ = inputs
    ctx.save_for_backward(q_sel, k_sel, output)


def _u_grad(ctx, d_u):
    q_sel, k_sel, u = ctx.saved_tensors
    batch, heads, m, d = q_sel.shape
    with autocast_off(u.device.type):
        d_scores = torch._softmax_backward_data(d_u, u, -1, u.dtype).view(-1, m, m)  # u ⊙ (dU − Σ dU ⊙ u)
        q_rows, k_rows = q_sel.float().view(-1, m, d), k_sel.float().view(-1, m, d)
        # the softmax's scale s in the products' alpha: dQ_I = s dS K_J, dK_J = s dSᵀ Q_I (beta 0: no input read)
        dq_sel = torch.baddbmm(q_rows, d_scores, k_rows, beta=0, alpha=d**-0.5).view(q_sel.shape)
        dk_sel = torch.baddbmm(k_rows, d_scores.mT, q_rows, beta=0, alpha=d**-0.5).view(k_sel.shape)
    return dq_sel.to(q_sel.dtype), dk_sel.to(k_sel.dtype), None


u_forward.register_autograd(_u_grad, setup_context=_u_setup)


@torch.library.custom_op("lra_flashcur::out_forward", mutates_args=())
def out_forward(q: Tensor, k_sel: Tensor, valid_k: Tensor, w: Tensor, rv: Tensor, slot: Tensor,
                index_q: Tensor, overwrite_rows: bool) -> tuple[Tensor, Tensor]:
    """``Y = softmax(s·Q K_Jᵀ) W`` with rows ``I`` set to ``RV`` (kernel c) -> ``(Y, lse)``; ``index_q`` and
    ``overwrite_rows`` serve the backward (``slot`` already encodes the rows in the forward)."""
    return run.out_forward(q, k_sel, valid_k, w, rv, slot)


@out_forward.register_fake
def _(q, k_sel, valid_k, w, rv, slot, index_q, overwrite_rows):
    return token_major(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("lra_flashcur::out_backward", mutates_args=())
def out_backward(q: Tensor, k_sel: Tensor, valid_k: Tensor, w: Tensor, slot: Tensor, y: Tensor, lse: Tensor,
                 d_y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Kernel (c)'s tiled backward (the ``C W`` part) -> ``(dQ, dK_J, dW)``: ``dQ`` in ``q``'s dtype, the m×d ones
    float32; ``y`` is the forward's output (``Δ_C`` is read off it)."""
    return run.out_backward(q, k_sel, valid_k, w, slot, y, lse, d_y)


@out_backward.register_fake
def _(q, k_sel, valid_k, w, slot, y, lse, d_y):
    return q.new_empty(q.shape), *(x.new_empty(x.shape, dtype=torch.float32) for x in (k_sel, w))


def _out_setup(ctx, inputs, output):
    q, k_sel, valid_k, w, rv, slot, index_q, overwrite_rows = inputs
    ctx.save_for_backward(q, k_sel, valid_k, w, slot, output[0], output[1], index_q)  # Y: what the next layer keeps
    ctx.m_padded = rv.shape[2]
    ctx.overwrite_rows = overwrite_rows
    ctx.set_materialize_grads(False)  # lse has no gradient: no zeros made for it


def _out_grad(ctx, d_y, d_lse):
    q, k_sel, valid_k, w, slot, y, lse, index_q = ctx.saved_tensors
    dq, dk_sel, dw = out_backward(q, k_sel, valid_k, w, slot, y, lse, d_y)
    d_rv = None
    if ctx.overwrite_rows:  # rows I of Y are RV (slots beyond index_q are padding, never written)
        d_rv = gather_rows(d_y, index_q).float()  # m rows: no n-sized float32 copy of dY
        if ctx.m_padded > index_q.shape[2]:
            d_rv = F.pad(d_rv, (0, 0, 0, ctx.m_padded - index_q.shape[2]))
    return dq.to(q.dtype), dk_sel.to(k_sel.dtype), None, dw, d_rv, None, None, None


out_forward.register_autograd(_out_grad, setup_context=_out_setup)


# FLOP formulas for torch.utils.flop_counter.FlopCounterMode (it does not see inside Triton kernels): the
# matmul FLOPs the kernels of each op run (PRODUCTS), from the argument shapes.
@register_flop_formula(torch.ops.lra_flashcur.rv_forward)
def _(q_sel, k, v, key_mask, *args, out_shape=None, **kwargs) -> int:
    batch, heads, m, d = q_sel
    return flops("rv_forward", batch * heads, k[2], m, d)


@register_flop_formula(torch.ops.lra_flashcur.rv_backward)
def _(q_sel, k, v, key_mask, rv, lse, d_rv, *args, out_shape=None, **kwargs) -> int:
    batch, heads, m, d = q_sel
    return flops("rv_backward", batch * heads, k[2], m, d)


@register_flop_formula(torch.ops.lra_flashcur.u_forward)
def _(q_sel, k_sel, valid_k, *args, out_shape=None, **kwargs) -> int:
    batch, heads, m, d = q_sel
    return flops("u_forward", batch * heads, 0, m, d)


@register_flop_formula(torch.ops.lra_flashcur.out_forward)
def _(q, k_sel, *args, out_shape=None, **kwargs) -> int:
    batch, heads, n, d = q
    return flops("out_forward", batch * heads, n, k_sel[2], d)


@register_flop_formula(torch.ops.lra_flashcur.out_backward)
def _(q, k_sel, *args, out_shape=None, **kwargs) -> int:
    batch, heads, n, d = q
    return flops("out_backward", batch * heads, n, k_sel[2], d)
