"""Score functions: the "attention function" half of score × approximation (docs/design.md §1 "Score functions and approximations").

A score function maps queries and keys to row-normalised attention weights::

    score(q, k, key_mask, q_index=None, k_index=None) -> weights

* ``q`` ``(B, H, a, d)``, ``k`` ``(B, H, b, d)``;
* ``key_mask`` bool, broadcastable to ``(B, H, 1, b)`` (True = key may be attended), or None;
* ``q_index`` ``(B, H, a)`` / ``k_index`` ``(B, H, b)``: long positions of these rows in the full
  sequence (None = ``arange``), for position-dependent scores (e.g. a relative-position bias);
* ``weights`` ``(B, H, a, b)``: softmax over ``b`` with masked keys at exactly 0 (a row whose keys
  are all masked is all 0).

Exact attention is ``score(q, k, mask) @ v``; CUR and Nyström apply the same score to selected or
averaged rows (:mod:`attention.cur`, :mod:`attention.nystrom`), so CUR with L1 scores is a config
change (``configs/attention/l1_cur.yaml``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from kernels.l1.cpu import L1Distance, uses_kernel
from kernels.landmark_attention import cpu as landmarks_cpu
from kernels.common.precision import autocast_off


class MaskedSoftmax(torch.autograd.Function):
    """Masked row softmax written into its input ``logits`` ``(..., b)`` (a fresh tensor nobody else needs).

    Branch-free and sync-free on other devices, so the same ops run whatever the mask holds (no
    ``bool(mask.all())``: on a GPU that blocks the host, stalls the launch queue and breaks CUDA and
    ``torch.compile`` graphs). On CPU, where reading the mask costs nothing, steps 1 and 3 run only when
    they change something (each is a full pass over the ``a × b`` logits).
    ``key_mask`` (bool, broadcastable to ``logits``, True = real key) or None:

    1. masked logits are shifted by half the dtype's lowest finite value (an add of a small
       ``key_mask``-shaped bias, one pass where a broadcast ``masked_fill_`` writes a mask-sized index, and it cannot
       overflow a finite logit), so ``exp`` gives them exactly 0 wherever the row has a real key;
    2. row softmax in place: on CPU ATen's kernel writes into its input (each row is read before it is
       overwritten; tests/attention/test_scores.py checks it against ``torch.softmax``), one pass over memory
       instead of five; other devices use in-place elementwise ops, which are correct for any kernel;
    3. rows without any real key are multiplied by 0 (instead of a uniform row over pads).

    Saves the one ``a × b`` allocation per call that an out-of-place softmax needs (on CPU a fresh
    16 MB tensor costs more in page faults than the softmax itself). Backward is the usual
    ``y ⊙ (g − Σ_b g ⊙ y)`` of the saved weights; it is 0 on the zeroed rows, as it should be.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        has_real = None if key_mask is None else key_mask.any(-1, keepdim=True)
        if logits.device.type == "cpu" and key_mask is not None:  # reading a CPU mask costs no sync
            has_real = None if bool(has_real.all()) else has_real  # step 3 only for rows without real keys
            key_mask = None if bool(key_mask.all()) else key_mask  # step 1 only with masked keys
        if key_mask is not None:
            low = torch.finfo(logits.dtype).min / 2
            logits.add_(logits.new_zeros(key_mask.shape).masked_fill_(~key_mask, low))
        if logits.device.type == "cpu" and logits.is_contiguous():
            torch.ops.aten._softmax.out(logits, -1, False, out=logits)
        else:
            logits.sub_(logits.amax(-1, keepdim=True)).exp_()
            logits.div_(logits.sum(-1, keepdim=True))
        if has_real is not None:
            logits.mul_(has_real)
        ctx.mark_dirty(logits)
        ctx.save_for_backward(logits)
        return logits

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (weights,) = ctx.saved_tensors
        if weights.device.type == "cpu":
            return torch.ops.aten._softmax_backward_data(grad.contiguous(), weights, -1, weights.dtype), None
        grad_weights = grad * weights
        return grad_weights.sub_(weights * grad_weights.sum(-1, keepdim=True)), None


def masked_softmax(logits: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim of ``logits`` ``(B, H, a, b)``; masked keys get exactly 0, and a row
    with no real key at all is all 0 (not NaN): :class:`MaskedSoftmax`.

    ``logits`` is overwritten **in place** (pass a fresh tensor, e.g. a matmul output; autograd
    raises if it were needed elsewhere). ``key_mask`` bool broadcastable to ``logits``, True = real key.

    Under ``torch.compile`` the same three steps are written out of place (:func:`masked_softmax_out_of_place`):
    the in-place form only saves eager mode an allocation, which the compiler's memory planning does
    itself, and tracing it with dynamic shapes (a batch of another length) fails inside PyTorch
    (torch 2.13: an internal assert in ``CopySlices`` while AOTAutograd traces the backward).
    """
    if torch.compiler.is_compiling():
        return masked_softmax_out_of_place(logits, key_mask)
    return MaskedSoftmax.apply(logits, key_mask)


def masked_softmax_out_of_place(logits: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """:class:`MaskedSoftmax`'s three steps out of place, differentiated by autograd (what compiled code runs)."""
    if key_mask is None:
        return torch.softmax(logits, -1)
    low = torch.finfo(logits.dtype).min / 2
    weights = torch.softmax(logits + logits.new_zeros(key_mask.shape).masked_fill_(~key_mask, low), -1)
    return weights * key_mask.any(-1, keepdim=True)


class SoftmaxScore(nn.Module):
    """``softmax(Q Kᵀ / √d + mask)`` (Vaswani et al. 2017, eq. 1). ``kernels``: whether :meth:`attend` may run the C++
    landmark kernels on CPU tensors (False in the ``pytorch`` form: :func:`attention.impl.configure` sets it)."""

    kernels = True

    def forward(self, q, k, key_mask=None, q_index=None, k_index=None) -> torch.Tensor:
        scale = q.shape[-1] ** -0.5
        if q.shape[-2] <= k.shape[-2]:  # scale the smaller operand: no extra n × d or n × m tensor
            logits = (q * scale) @ k.transpose(-1, -2)  # (B, H, a, b)
        else:
            logits = q @ (k * scale).transpose(-1, -2)
        return masked_softmax(logits, key_mask)

    def attend(self, q, k, key_mask, v, q_index=None, k_index=None) -> torch.Tensor:
        """``self(q, k, key_mask) @ v`` ``(B, H, a, e)`` for ``v`` ``(B, H, b, e)``.

        On CPU one fused call of ``scaled_dot_product_attention`` (its flash kernel: blocks of the ``a × b``
        logits stay in cache, the weights are never stored, backward recomputes them), whose boolean mask
        gives masked keys exactly 0 and a row without any real key all 0, as :func:`masked_softmax` does;
        with few keys or few queries (≤ 128: CUR's and Nyström's ``C W`` and ``R V``) its forward is a kernel of
        :mod:`kernels.landmark_attention.cpu`, which never writes the weights either. Other devices multiply the weights of
        :meth:`forward`, as before (SDPA's GPU backends were not checked here on rows without a real key).
        """
        if q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64):
            mask = None if key_mask is None else key_mask.expand(*key_mask.shape[:-2], 1, key_mask.shape[-1])
            return landmarks_cpu.attend(q, k, v, mask, kernel=self.kernels)
        return self(q, k, key_mask) @ v

    def kernel_form(self, d: int) -> tuple[float, bool]:
        """``(scale, l1)`` of :mod:`kernels.landmark_attention.cpu`' kernels for this score at head size ``d``."""
        return d**-0.5, False


class L1Score(nn.Module):
    """EcoTransformer (Gao & Xu 2025, eq. 1): ``softmax(−λ ‖q_i − k_j‖₁ / √d + mask)``.

    Closer keys get larger weights (mind the sign). The distance runs in float32 with autocast
    disabled (float64 stays float64) through :class:`kernels.l1.cpu.L1Distance`, with the scale ``−λ/√d`` folded in,
    and never materialises a ``(B, H, a, b, d)`` tensor beyond one query chunk. ``lam`` = λ, 1 by
    default (3 is the paper's "robust").
    """

    rotation_invariant = False  # ‖Rq − Rk‖₁ ≠ ‖q − k‖₁: rotary positions are not relative under this score
    kernels = True  # the C++ L1 kernels on CPU tensors (False in the pytorch form, attention.impl.configure)

    def __init__(self, lam: float = 1.0):
        super().__init__()
        if not lam > 0:
            raise ValueError(f"attention.score.lam (λ of the L1 score) must be > 0, got {lam}")
        self.lam = float(lam)

    def forward(self, q, k, key_mask=None, q_index=None, k_index=None) -> torch.Tensor:
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        with autocast_off(q.device.type):
            logits = L1Distance.apply(q.to(dtype), k.to(dtype), -self.lam / math.sqrt(q.shape[-1]), self.kernels)
            return masked_softmax(logits, key_mask)

    def attend(self, q, k, key_mask, v, q_index=None, k_index=None) -> torch.Tensor:
        """``self(q, k, key_mask) @ v`` ``(B, H, a, e)`` for ``v`` ``(B, H, b, e)``, in float32 (float64 stays).

        On CPU, where the keys or the queries are at most 128 (CUR's ``C W`` and ``R V``), the L1 forms of the
        landmark kernels (:func:`kernels.landmark_attention.cpu.attend` with ``l1_scale``): the ``a × b`` weights are never
        stored, backward recomputes them a tile at a time. Elsewhere the weights of :meth:`forward` times ``v``.
        """
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        with autocast_off(q.device.type):
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
            mask = None if key_mask is None else key_mask.expand(*key_mask.shape[:-2], 1, key_mask.shape[-1])
            if (self.kernels and uses_kernel(q) and landmarks_cpu.kernel_for(q, k, v, mask) is not None
                    and landmarks_cpu.backward_library() is not None):
                return landmarks_cpu.attend(q, k, v, mask, l1_scale=self.kernel_form(q.shape[-1])[0])
            return self(q, k, key_mask) @ v

    def kernel_form(self, d: int) -> tuple[float, bool]:
        """``(scale, l1)`` of :mod:`kernels.landmark_attention.cpu`' kernels for this score at head size ``d``."""
        return -self.lam / math.sqrt(d), True


KERNEL_SCORES = (SoftmaxScore, L1Score)  # the scores with ``attend`` and ``kernel_form``: the landmark kernels compute them
