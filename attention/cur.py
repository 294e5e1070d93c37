"""CUR attention (CURformer; François et al., Machine Learning 2025, §4–5, Alg. 1; docs/design.md §2 "CURformer").

Per sequence and head, with ``m`` selected query rows ``I`` and key rows ``J``
(:func:`attention.selection.select_indices`) and a score function ``s``
(:mod:`attention.scores`, softmax by default)::

    C = s(Q, K_J)              (n × m)
    R = s(Q_I, K, pad mask)    (m × n)   rows I of the exact attention matrix
    U = C[I, :]                (m × m)   rows of the normalised C, not a fresh softmax (§4.1)
    Y = C (U⁺ (R V)),  then  Y[I] = R V  when ``overwrite_rows`` (those rows are exact)

computed as ``W = U⁺ (R V)`` then ``Y = C W``. The softmax and L1 scores (:data:`attention.scores.KERNEL_SCORES`)
form both products with their ``attend`` (:meth:`attention.scores.SoftmaxScore.attend`: one fused SDPA call on CPU), so
``C`` and ``R`` are never stored, and ``U`` is then the score of ``Q_I`` against ``K_J`` with ``C``'s mask,
which is ``C[I, :]`` row for row (the same normalised rows, only the ``m`` of them); other scores (L1, MEGA's)
materialise ``C`` and ``R`` and take ``U`` from ``C``'s rows.

with ``U⁺`` the iterative pseudo-inverse (:mod:`attention.pinv`, ``pinv_iters`` iterations; ``pinv_init``
``per_head`` scales its start ``Z₀`` per sequence and head as Nyströmformer eq. 16 writes, ``global`` by
one maximum over the batch as the public Nyströmformer code does).
Cost O(nmd + m²d + m³) time, O(nm + m²) memory (§4.2): C and R are the largest tensors (O(nd + m²) with a
fused ``attend``); no ``n × n`` matrix and no one-hot selection matrix is built (rows are taken with ``gather``).
Which form runs is ``attention.impl``'s (:mod:`attention.impl`, family ``cur``): ``cpu`` (CPU tensors; training
with the softmax or the L1 score runs the same products as one autograd node, :mod:`kernels.cur.cpu`, whose backward
writes no ``n × d`` copies), ``pytorch`` (no C++ kernel) or ``fused``: by default on other devices than the CPU
(CUDA; ``meta``) the softmax score runs the fused forms (
:func:`fused_cur_attention`): batched GEMMs over the ``n × m`` weights, split over ``n``, in the inputs' dtype (bf16
under autocast, on tensor cores) where the data is ``n``-sized and float32 where it is ``m``-sized
(:mod:`attention.landmark_stages`), no host sync.

Decisions: the CPU forms and the other scores run in float32 with autocast disabled (float64 stays float64); the
output is cast back to the input dtype. Slots that :mod:`attention.selection` had to put on pad
positions (sequences with ``n_real < m``) are invalid: their columns of ``C`` are masked, their
block of ``U`` is the identity, so ``U⁺`` inverts the real block only and CUR equals exact
attention when every real token is selected. No attention dropout (the CUR paper uses none).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import nn

from attention import impl, landmark_stages, paths
from attention.config_checks import check_positive_int
from attention.pinv import check_pinv_init, iterative_pinv
from attention.scores import KERNEL_SCORES, SoftmaxScore
from attention.selection import check_selection, select_indices
from kernels.common.precision import autocast_off
from kernels.common.rows import gather_rows
from kernels.cur import cpu as cur_cpu

ScoreFn = Callable[..., torch.Tensor]


class _WithRows(torch.autograd.Function):
    """``(x, gather_rows(x, index))`` as one autograd node, for a tensor used whole *and* by its rows I.

    Same values and gradients as taking the two separately; backward adds the rows' gradient into a copy
    of ``x``'s (``scatter_add``) instead of autograd's zero-filled ``x``-sized scatter plus a sum of the
    two: two ``n × d`` passes fewer per backward (docs/bench.md, "Numbers kept out of the code").
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor):
        ctx.save_for_backward(index)
        return x.view_as(x), gather_rows(x, index)

    @staticmethod
    def backward(ctx, grad_x: torch.Tensor, grad_rows: torch.Tensor):
        (index,) = ctx.saved_tensors
        return grad_x.scatter_add(2, index[..., None].expand_as(grad_rows), grad_rows), None


def _with_rows(x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, gather_rows(x, index))``, through :class:`_WithRows` when autograd records ``x``."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _WithRows.apply(x, index)
    return x, gather_rows(x, index)


def _wants_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in tensors)


def cur_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    index_q: torch.Tensor,
    index_k: torch.Tensor,
    score: ScoreFn | None = None,
    pinv_iters: int = 6,
    overwrite_rows: bool = True,
    pinv_init: str = "per_head",
    forms: impl.Forms | None = None,
) -> torch.Tensor:
    """CUR approximation of ``score(Q, K, mask) V`` -> ``(B, H, n, d)`` (equations in the module doc), in ``forms``
    (:func:`attention.impl.resolve`; None: ``auto``'s for ``q``'s device and dtype).

    ``q, k, v`` ``(B, H, n, d)``; ``key_mask`` bool ``(B, n)`` or None; ``index_q``, ``index_k`` long
    ``(B, H, m)``, distinct within a (sequence, head); invalid (pad) slots must sit at the same
    positions of ``index_q`` and ``index_k`` (as :func:`select_indices` returns them).
    """
    score = score if score is not None else SoftmaxScore()
    forms = forms or impl.resolve("cur", "auto", q.device.type, q.dtype)
    out_dtype = v.dtype
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    batch, heads, n, _ = q.shape
    if key_mask is None:
        key_mask = torch.ones(batch, n, dtype=torch.bool, device=q.device)
    with autocast_off(q.device.type):
        if forms.attention == "fused" and isinstance(score, SoftmaxScore):  # n-sized stages in the inputs' dtype
            return fused_cur_attention(q, k, v.to(q.dtype), key_mask, index_q, index_k, pinv_iters, overwrite_rows,
                                       pinv_init, forms.pinv, forms.rows).to(out_dtype)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        positions_mask = key_mask[:, None, :].expand(batch, heads, n)
        valid_q = positions_mask.gather(2, index_q)  # (B, H, m)
        valid_k = positions_mask.gather(2, index_k)  # (B, H, m)
        streamed = isinstance(score, KERNEL_SCORES)  # C and R never stored: U as the score of Q_I against K_J
        if (forms.attention == "cpu" and streamed and _wants_grad(q, k, v)
                and cur_cpu.takes(q, k, v, index_q.shape[-1])):
            pinv = functools.partial(iterative_pinv, n_iter=pinv_iters, init=pinv_init, form=forms.pinv)
            y = cur_cpu.CURKernelAttention.apply(q, k, v, key_mask, index_q, index_k, valid_q, valid_k, score, pinv,
                                                 overwrite_rows)  # one node, no n × d copies
            return y.to(out_dtype)
        q, q_rows = _with_rows(q, index_q)  # (B, H, n, d), (B, H, m, d)
        k, k_rows = _with_rows(k, index_k)
        valid_keys = valid_k[:, :, None, :]  # (B, H, 1, m)
        if streamed:
            rv = score.attend(q_rows, k, key_mask[:, None, None, :], v, index_q, None)  # R V, (B, H, m, d)
            c_rows = score(q_rows, k_rows, valid_keys, index_q, index_k)  # U = C[I], (B, H, m, m)
        else:
            c = score(q, k_rows, valid_keys, None, index_k)  # (B, H, n, m)
            c, c_rows = _with_rows(c, index_q)  # C and its rows I, (B, H, m, m)
            rv = score(q_rows, k, key_mask[:, None, None, :], index_q, None) @ v  # (B, H, m, d)
        eye = torch.eye(index_q.shape[-1], dtype=dtype, device=q.device)
        u = torch.where(valid_q[..., None], c_rows, eye)  # (B, H, m, m); identity rows on invalid slots
        w = iterative_pinv(u, pinv_iters, pinv_init, form=forms.pinv) @ rv  # U⁺ (R V), (B, H, m, d)
        y = score.attend(q, k_rows, valid_keys, w, None, index_k) if streamed else c @ w  # C (U⁺ R V), (B, H, n, d)
        if overwrite_rows:  # in place unless autograd saved y (SDPA saves its output for backward)
            rows = index_q[..., None].expand_as(rv)
            saved = streamed and torch.is_grad_enabled() and y.requires_grad
            y = y.scatter(2, rows, rv) if saved else y.scatter_(2, rows, rv)
    return y.to(out_dtype)


def fused_cur_attention(q, k, v, key_mask, index_q, index_k, pinv_iters: int, overwrite_rows: bool,
                        pinv_init: str, pinv_form: str = "triton", rows_form: str = "triton") -> torch.Tensor:
    """:func:`cur_attention` with the softmax score in the ``fused`` form (:mod:`attention.impl`), in the inputs' dtype
    (bf16 under autocast) where the data is ``n``-sized and float32 where it is ``m``-sized
    (:mod:`attention.landmark_stages`: batched GEMMs over the materialised ``n × m`` weights, split over ``n``)::

        R V = rows_attention(Q_I, K, V, pad mask)      m queries over the n keys, float32    (B, H, m, d)
                                                       (FlashCUR's kernel (a) with rows_form "triton")
        U   = core_weights(Q_I, K_J)                   C[I], float32                           (B, H, m, m)
        Y   = columns_attention(Q, K_J, U⁺ (R V))      n queries over the m selected keys    (B, H, n, d)

    then ``Y[I] = R V``. Invalid slots (pads selected when ``n_real < m``) are masked as keys and their rows of ``U``
    are identity rows, as in the CPU form. No host synchronisation; ``python -m lra.bench plan`` lists the kernels.
    """
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # the products' (B·H, n, d) operands, made once
    batch, heads, n, _ = q.shape
    positions_mask = key_mask[:, None, :].expand(batch, heads, n)
    valid_q = positions_mask.gather(2, index_q)  # (B, H, m)
    valid_k = valid_q if index_k is index_q else positions_mask.gather(2, index_k)
    q, q_rows = _with_rows(q, index_q)  # (B, H, n, d), (B, H, m, d)
    k, k_rows = _with_rows(k, index_k)
    rv = landmark_stages.rows_attention(q_rows, k, v, key_mask, rows_form)  # (B, H, m, d) float32
    u = landmark_stages.core_weights(q_rows, k_rows, valid_q, valid_k)  # (B, H, m, m) float32
    w, rv = paths.product_and_rows(iterative_pinv(u, pinv_iters, pinv_init, form=pinv_form), rv)  # U⁺ (R V)
    y = landmark_stages.columns_attention(q, k_rows, w, valid_k)  # C W, (B, H, n, d)
    if overwrite_rows:  # out of place: autograd forbids writing into a custom Function's output (a view of its GEMM)
        y = y.scatter(2, index_q[..., None].expand_as(rv), rv.to(y.dtype))
    return y


class CURAttention(nn.Module):
    """Drop-in CUR attention: selection (:mod:`attention.selection`) + :func:`cur_attention`, in the forms of
    ``attention.impl`` (family ``cur``: :mod:`attention.impl`).

    Defaults are the paper's LRA setting: ``num_landmarks`` m = 64, ``selection='abs'``,
    ``same_indices`` (I = J), ``pinv_iters`` = 6, ``overwrite_rows``, no ``force_cls`` (mean pooling);
    ``pinv_init`` (``per_head`` | ``global``) is the scale of the pseudo-inverse's start (:mod:`attention.pinv`).
    ``score`` is a factory (Hydra ``_partial_``) called with no argument, or a score module; None
    means softmax (:class:`attention.scores.SoftmaxScore`). No parameters of its own, so a softmax
    checkpoint loads with ``strict=True``.
    """

    impl_family = "cur"

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
        score: Callable[[], nn.Module] | nn.Module | None = None,
        pinv_init: str = "per_head",
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.impl = "auto"  # attention.impl, set by attention.impl.configure
        self.num_landmarks = check_positive_int(num_landmarks, "num_landmarks")
        self.pinv_iters = check_positive_int(pinv_iters, "pinv_iters")
        self.pinv_init = check_pinv_init(pinv_init)
        check_selection(selection, embed_column, head_dim)
        self.selection = selection
        self.same_indices = bool(same_indices)
        self.embed_column = embed_column
        self.overwrite_rows = bool(overwrite_rows)
        self.force_cls = bool(force_cls)
        if score is None:
            score = SoftmaxScore()
        self.score = score if isinstance(score, nn.Module) else score()

    def select(self, q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor | None, form: str | None = None):
        """``(index_q, index_k)`` for this module's selection settings, each ``(B, H, min(m, n))``, in ``form``
        (:func:`attention.selection.select_indices`)."""
        return select_indices(
            q, k, key_mask, self.num_landmarks, self.selection, self.same_indices, self.embed_column, self.force_cls,
            form=form,
        )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        forms = impl.forms_for(self, q)  # attention.impl on this device and dtype (static facts: no sync)
        index_q, index_k = self.select(q, k, key_mask, forms.selection)
        return cur_attention(
            q, k, v, key_mask, index_q, index_k, self.score, self.pinv_iters, self.overwrite_rows, self.pinv_init,
            forms,
        )

    def extra_repr(self) -> str:
        return (
            f"num_landmarks={self.num_landmarks}, selection={self.selection!r}, same_indices={self.same_indices}, "
            f"pinv_iters={self.pinv_iters}, pinv_init={self.pinv_init!r}, overwrite_rows={self.overwrite_rows}, force_cls={self.force_cls}"
        )
