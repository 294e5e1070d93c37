"""FlashCUR attention (FlashCURformer; François et al., Machine Learning 2025, §5.2, Alg. 2; docs/design.md §2 "FlashCUR").

The CUR approximation of :mod:`attention.cur` (softmax score), computed by the fused Triton kernels
of :mod:`kernels.flashcur` (forward and backward, launched by :mod:`kernels.flashcur.ops`)::

    RV = softmax(s·Q_I Kᵀ + pad mask) V     kernel (a), online softmax over key tiles    (m × d)
    U  = softmax(s·Q_I K_Jᵀ)                kernel (b)                                   (m × m)
    W  = U⁺ RV                              PyTorch, float32 (``attention.pinv``)         (m × d)
    Y  = softmax(s·Q K_Jᵀ) W, Y[I] = RV     kernel (c), one query tile per program       (n × d)

``s = 1/√d``. ``C`` (n×m) and ``R`` (m×n) are never stored: the forward keeps only their row
log-sum-exps (n + m floats per head) and the backward recomputes them tile by tile. Between the kernels a
handful of batched operators (selection, the rows ``Q_I`` and ``K_J``, ``U``'s identity rows on invalid slots,
``W``, the merge of the split kernels' partials), no host synchronisation: 36 kernel launches for a layer's forward
and backward at n 4096, B 8, H 2, m 64 with a fused pseudo-inverse (``python -m lra.bench launches``; where each
runs: ``python -m lra.bench plan``).

Parameters and defaults are CURformer's (``configs/attention/curformer.yaml``; selection by
:func:`attention.selection.select_indices`, same rules and decisions, including ``n_real < m``).
Decisions: the kernels implement the softmax score only (CUR's ``score`` option is absent; use
``attention=curformer`` for other scores). m = min(num_landmarks, n) is padded up to the next of
16/32/64/128 with inert slots (masked columns of C, identity block of U, never written to Y), so
any m ≤ 128 runs. ``W`` and ``RV`` are float32; q/k/v may be float32, float16 or bfloat16
(float32 accumulation; with bf16 / fp16 every kernel product runs on tensor cores in that dtype); the output and
the n × d gradients have q's dtype. The kernels whose programs walk all n tokens split n so a GPU gets at least
two waves of programs (per-split partials merged exactly: :mod:`kernels.flashcur.ops`). Needs CUDA tensors, or the Triton interpreter
(``TRITON_INTERPRET=1`` set before :mod:`kernels.flashcur` is imported; on CPU, for tests at tiny shapes).
Cost as CUR: O(nmd + m²d + m³) time; O(nd + md + m²) memory (no O(nm) term).

Each kernel (pair) is a ``torch.library`` custom op (``lra_flashcur::*``) with a fake implementation (shapes
and dtypes: the ``meta`` device, ``torch.compile``'s tracing), its autograd formula and its FLOP formula (for
``torch.utils.flop_counter``, which cannot see inside the kernels: :data:`kernels.flashcur.ops.PRODUCTS`)
registered on it.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import register_flop_formula

from attention import paths
from attention.cur import CURAttention, _with_rows
from attention.pinv import fused_takes, iterative_pinv
from attention.precision import autocast_off
from attention.selection import gather_rows
from kernels.common.launch import device_capability, interpreted
from kernels.flashcur import launch as kernel_launch
from kernels.flashcur import ops


# The kernels as torch.library custom ops: one dispatcher op per kernel (pair), a fake implementation
# (shapes and dtypes only) that serves the meta device and torch.compile's tracing, and the autograd
# formulas registered on the forward ops. The backward ops run under no_grad (no double backward).
Tensor = torch.Tensor


@torch.library.custom_op("lra_flashcur::rv_forward", mutates_args=())
def _rv_forward(q_sel: Tensor, k: Tensor, v: Tensor, key_mask: Tensor) -> tuple[Tensor, Tensor]:
    """``RV = softmax(s·Q_I Kᵀ + pad mask) V`` (kernel a) -> ``(RV, lse)``, float32 ``(B,H,m,d)``, ``(B,H,m)``."""
    return ops.rv_forward(q_sel, k, v, key_mask)


@_rv_forward.register_fake
def _(q_sel, k, v, key_mask):
    return q_sel.new_empty(q_sel.shape, dtype=torch.float32), q_sel.new_empty(q_sel.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("lra_flashcur::rv_backward", mutates_args=())
def _rv_backward(q_sel: Tensor, k: Tensor, v: Tensor, key_mask: Tensor, rv: Tensor, lse: Tensor,
                 d_rv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Kernel (a)'s tiled backward -> ``(dQ_I, dK, dV)``: ``dQ_I`` float32 (m×d), ``dK, dV`` in the inputs' dtype."""
    return ops.rv_backward(q_sel, k, v, key_mask, rv, lse, d_rv)


@_rv_backward.register_fake
def _(q_sel, k, v, key_mask, rv, lse, d_rv):
    return q_sel.new_empty(q_sel.shape, dtype=torch.float32), k.new_empty(k.shape), v.new_empty(v.shape)


def _rv_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, *output)
    ctx.set_materialize_grads(False)  # lse has no gradient: no zeros made for it


def _rv_grad(ctx, d_rv, d_lse):
    q_sel, k, v, key_mask, rv, lse = ctx.saved_tensors
    dq_sel, dk, dv = _rv_backward(q_sel, k, v, key_mask, rv, lse, d_rv)
    return dq_sel.to(q_sel.dtype), dk.to(k.dtype), dv.to(v.dtype), None


_rv_forward.register_autograd(_rv_grad, setup_context=_rv_setup)


@torch.library.custom_op("lra_flashcur::u_forward", mutates_args=())
def _u_forward(q_sel: Tensor, k_sel: Tensor, valid_k: Tensor) -> Tensor:
    """``U = softmax(s·Q_I K_Jᵀ)`` over valid key slots (kernel b), float32 ``(B,H,m,m)``; m×m backward in PyTorch."""
    return ops.u_forward(q_sel, k_sel, valid_k)


@_u_forward.register_fake
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


_u_forward.register_autograd(_u_grad, setup_context=_u_setup)


@torch.library.custom_op("lra_flashcur::out_forward", mutates_args=())
def _out_forward(q: Tensor, k_sel: Tensor, valid_k: Tensor, w: Tensor, rv: Tensor, slot: Tensor,
                 index_q: Tensor, overwrite_rows: bool) -> tuple[Tensor, Tensor]:
    """``Y = softmax(s·Q K_Jᵀ) W`` with rows ``I`` set to ``RV`` (kernel c) -> ``(Y, lse)``; ``index_q`` and
    ``overwrite_rows`` serve the backward (``slot`` already encodes the rows in the forward)."""
    return ops.out_forward(q, k_sel, valid_k, w, rv, slot)


@_out_forward.register_fake
def _(q, k_sel, valid_k, w, rv, slot, index_q, overwrite_rows):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("lra_flashcur::out_backward", mutates_args=())
def _out_backward(q: Tensor, k_sel: Tensor, valid_k: Tensor, w: Tensor, slot: Tensor, lse: Tensor,
                  d_y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Kernel (c)'s tiled backward (the ``C W`` part) -> ``(dQ, dK_J, dW)``: ``dQ`` in ``q``'s dtype, the m×d ones float32."""
    return ops.out_backward(q, k_sel, valid_k, w, slot, lse, d_y)


@_out_backward.register_fake
def _(q, k_sel, valid_k, w, slot, lse, d_y):
    return q.new_empty(q.shape), *(x.new_empty(x.shape, dtype=torch.float32) for x in (k_sel, w))


def _out_setup(ctx, inputs, output):
    q, k_sel, valid_k, w, rv, slot, index_q, overwrite_rows = inputs
    ctx.save_for_backward(q, k_sel, valid_k, w, slot, output[1], index_q)
    ctx.m_padded = rv.shape[2]
    ctx.overwrite_rows = overwrite_rows
    ctx.set_materialize_grads(False)  # lse has no gradient: no zeros made for it


def _out_grad(ctx, d_y, d_lse):
    q, k_sel, valid_k, w, slot, lse, index_q = ctx.saved_tensors
    dq, dk_sel, dw = _out_backward(q, k_sel, valid_k, w, slot, lse, d_y)
    d_rv = None
    if ctx.overwrite_rows:  # rows I of Y are RV (slots beyond index_q are padding, never written)
        d_rv = gather_rows(d_y, index_q).float()  # m rows: no n-sized float32 copy of dY
        if ctx.m_padded > index_q.shape[2]:
            d_rv = F.pad(d_rv, (0, 0, 0, ctx.m_padded - index_q.shape[2]))
    return dq.to(q.dtype), dk_sel.to(k_sel.dtype), None, dw, d_rv, None, None, None


_out_forward.register_autograd(_out_grad, setup_context=_out_setup)


# FLOP formulas for torch.utils.flop_counter.FlopCounterMode (it does not see inside Triton kernels): the
# matmul FLOPs the kernels of each op run (kernels.flashcur.ops.PRODUCTS), from the argument shapes.
@register_flop_formula(torch.ops.lra_flashcur.rv_forward)
def _(q_sel, k, v, key_mask, *args, out_shape=None, **kwargs) -> int:
    batch, heads, m, d = q_sel
    return ops.flops("rv_forward", batch * heads, k[2], m, d)


@register_flop_formula(torch.ops.lra_flashcur.rv_backward)
def _(q_sel, k, v, key_mask, rv, lse, d_rv, *args, out_shape=None, **kwargs) -> int:
    batch, heads, m, d = q_sel
    return ops.flops("rv_backward", batch * heads, k[2], m, d)


@register_flop_formula(torch.ops.lra_flashcur.u_forward)
def _(q_sel, k_sel, valid_k, *args, out_shape=None, **kwargs) -> int:
    batch, heads, m, d = q_sel
    return ops.flops("u_forward", batch * heads, 0, m, d)


@register_flop_formula(torch.ops.lra_flashcur.out_forward)
def _(q, k_sel, *args, out_shape=None, **kwargs) -> int:
    batch, heads, n, d = q
    return ops.flops("out_forward", batch * heads, n, k_sel[2], d)


@register_flop_formula(torch.ops.lra_flashcur.out_backward)
def _(q, k_sel, *args, out_shape=None, **kwargs) -> int:
    batch, heads, n, d = q
    return ops.flops("out_backward", batch * heads, n, k_sel[2], d)


class _RecomputedPinv(torch.autograd.Function):
    """:func:`attention.pinv.iterative_pinv` in its PyTorch form saving only ``U``: the backward runs the iteration
    again and differentiates it, so its ``5 · n_iter`` matrices of ``m × m`` per head (at n = 4096, m = 64 half the
    size of an ``n × m`` one) are not kept from forward to backward. (``torch.utils.checkpoint`` does the same but
    makes a tensor on the host in each call, which a GPU step must not.)"""

    @staticmethod
    def forward(ctx, u: torch.Tensor, n_iter: int, init: str) -> torch.Tensor:
        ctx.save_for_backward(u)
        ctx.n_iter, ctx.init = n_iter, init
        return iterative_pinv(u, n_iter, init)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (u,) = ctx.saved_tensors
        with torch.enable_grad():
            u = u.detach().requires_grad_()
            return torch.autograd.grad(iterative_pinv(u, ctx.n_iter, ctx.init), u, grad)[0], None, None


@functools.lru_cache(maxsize=None)
def _slot_numbers(m: int, device: torch.device) -> torch.Tensor:
    """``0, 1, …, m − 1`` as int32 on ``device``, made once (a constant, not a launch per call)."""
    return torch.arange(m, dtype=torch.int32, device=device)


def _padded_size(m: int) -> int:
    """The smallest kernel size in ``kernels.flashcur.launch.SUPPORTED_M`` that holds ``m`` slots."""
    for size in kernel_launch.SUPPORTED_M:
        if m <= size:
            return size
    raise ValueError(
        f"FlashCUR supports at most {kernel_launch.SUPPORTED_M[-1]} selected rows (attention.num_landmarks), got {m}; "
        "lower attention.num_landmarks or use attention=curformer"
    )


def check_device(q: torch.Tensor) -> None:
    """FlashCUR runs its kernels on CUDA tensors, or on CPU tensors under the Triton interpreter; on ``meta``
    tensors (shapes only) the custom ops' fake implementations run instead."""
    if q.is_cuda or q.device.type == "meta" or (q.device.type == "cpu" and interpreted()):
        return
    hint = (
        "kernels.flashcur was imported without TRITON_INTERPRET=1: set it in the environment before "
        "starting Python"
        if q.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
        else "run on a CUDA GPU (trainer=gpu), set TRITON_INTERPRET=1 before starting Python to run "
        "the kernels in Triton's (slow) CPU interpreter, or use attention=curformer (same method in PyTorch)"
    )
    raise RuntimeError(f"attention=flashcur needs CUDA tensors or the Triton interpreter; got {q.device} tensors: {hint}")


def flashcur_attention(q, k, v, key_mask, index_q, index_k, pinv_iters=6, overwrite_rows=True, pinv_init="per_head"):
    """CUR attention through the fused kernels -> ``(B, H, n, d)`` in ``q``'s dtype.

    Same contract as :func:`attention.cur.cur_attention` with the softmax score: ``q, k, v``
    ``(B, H, n, d)``, ``key_mask`` bool ``(B, n)``, ``index_q, index_k`` long ``(B, H, m)``.
    """
    check_device(q)
    if not q.dtype == k.dtype == v.dtype or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"FlashCUR takes q, k, v of one dtype among float32/float16/bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    batch, heads, n, _ = q.shape
    m = index_q.shape[2]
    size = _padded_size(m)
    positions_mask = key_mask[:, None, :].expand(batch, heads, n)
    same = index_k is index_q
    if size > m:  # inert slots up to the kernels' size: never valid, never written to Y
        index_q = F.pad(index_q, (0, size - m))
        index_k = index_q if same else F.pad(index_k, (0, size - m))
    valid_q = positions_mask.gather(2, index_q)  # (B, H, M)
    valid_k = valid_q if same else positions_mask.gather(2, index_k)
    if size > m:
        real_slot = _slot_numbers(size, q.device) < m
        valid_q = valid_q & real_slot
        valid_k = valid_q if same else valid_k & real_slot
    q, q_sel = _with_rows(q, index_q)  # (B, H, n, d), (B, H, M, d)
    k, k_sel = _with_rows(k, index_k)
    rv, _ = _rv_forward(q_sel, k, v, key_mask)  # (B, H, M, d) float32
    with autocast_off(q.device.type):
        eye = paths.identity(size, torch.float32, q.device)
        u = torch.where(valid_q[..., None], _u_forward(q_sel, k_sel, valid_k), eye)  # identity rows on invalid slots
        # U⁺, (B, H, M, M): the fused kernels keep one iterate a step for their backward, the PyTorch form recomputes
        pinv = iterative_pinv(u, pinv_iters, pinv_init) if fused_takes(u) else _RecomputedPinv.apply(u, pinv_iters, pinv_init)
        w, rv = paths.product_and_rows(pinv, rv)  # U⁺ RV, (B, H, M, d)
    slot = torch.full((batch, heads, n), -1, dtype=torch.int32, device=q.device)
    if overwrite_rows:
        slot.scatter_(2, index_q[..., :m], _slot_numbers(m, q.device).expand(batch, heads, m))
    y, _ = _out_forward(q, k_sel, valid_k, w, rv, slot, index_q[..., :m], overwrite_rows)
    return y


class FlashCURAttention(CURAttention):
    """Drop-in FlashCUR attention: CUR's selection and parameters, Triton kernels for the products.

    Same arguments and defaults as :class:`attention.cur.CURAttention` minus ``score`` (softmax only).
    Raises at construction when neither CUDA nor ``TRITON_INTERPRET=1`` is available.
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_landmarks: int = 64,
        selection: str = "abs",
        same_indices: bool = True,
        embed_column: int = 0,
        pinv_iters: int = 6,
        overwrite_rows: bool = True,
        force_cls: bool = False,
        pinv_init: str = "per_head",
    ):
        building_on_meta = torch.get_default_device().type == "meta"  # shapes only: the ops' fake implementations run
        if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1" or building_on_meta):
            raise RuntimeError(
                "attention=flashcur needs a CUDA GPU or the Triton interpreter (TRITON_INTERPRET=1, set before "
                "starting Python; CPU, slow); neither is available. Use attention=curformer on this machine."
            )
        super().__init__(
            num_heads, head_dim, num_landmarks, selection, same_indices, embed_column, pinv_iters, overwrite_rows, force_cls,
            pinv_init=pinv_init,
        )
        kernel_launch.check_head_dim(head_dim)
        if torch.cuda.is_available():  # tiles must fit this GPU's shared memory; fp32 is checked at launch
            capability = device_capability(torch.device("cuda", torch.cuda.current_device()))
            kernel_launch.check_shape(_padded_size(self.num_landmarks), head_dim, capability)
        else:
            _padded_size(self.num_landmarks)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        index_q, index_k = self.select(q, k, key_mask)
        return flashcur_attention(
            q, k, v, key_mask, index_q, index_k, self.pinv_iters, self.overwrite_rows, self.pinv_init
        )
