"""Nyström attention (Nyströmformer, Xiong et al. 2021, eq. 14–16; docs/design.md §2 "Nystromformer").

With ``m`` landmarks ``Q̃, K̃`` (segment means of Q and K over real tokens)::

    k1 = softmax(Q K̃ᵀ/√d)     (n × m)
    k2 = softmax(Q̃ K̃ᵀ/√d)     (m × m)
    k3 = softmax(Q̃ Kᵀ/√d + pad mask)  (m × n)
    Y  = k1 pinv(k2) (k3 V)  [+ depthwise conv over V along the sequence, one kernel per head]

Decisions: segments are mask-aware and of mixed sizes: the real token of rank ``r`` (among the
``n_real`` real tokens) belongs to segment ``⌊r·m/n_real⌋``, so any ``n`` works and pad rows never
enter a mean. When ``n_real ≤ m`` every real token is its own landmark and the empty segments are
invalid: masked as keys, identity block in ``k2`` (as in :mod:`attention.cur`). Then ``k1 = k2 = k3``
restricted to real tokens is the exact attention matrix ``A``, so ``Y = A pinv(A) A V`` equals exact
attention ``A V`` (apart from the conv) only as far as the iterative ``pinv`` (eq. 16) has converged
on ``A``, which takes about 20 iterations, not the default 6. Measured (float64, n = 40 with 40 and
23 real tokens, d = 8, m = 40 or 64, q, k, v ~ N(0, 1), 10 seeds; max |Y − A V| over real rows):
3.1–3.7e-2 at 6 iterations, 1.7–3.0e-3 at 10, ≤ 1.2e-4 at 15, ≤ 2.4e-6 at 20 (1e-14 for most
seeds); with q, k halved, 1.6–2.5e-2 at 6. The conv (``conv_kernel_size``, 35 in the LRA code;
null disables it) sees V with pad rows zeroed; :class:`SequenceConv` computes it (the sums of ``F.conv1d``
with ``groups = heads``) on CPU with the kernels of :mod:`kernels.seqconv`, elsewhere and under
``torch.compile`` as banded matrix products over blocks of the sequence, the pad mask and the sum with the
attention term folded into the copies those products make. ``k3 V`` and ``k1 (pinv(k2) k3 V)``
go through :meth:`attention.scores.SoftmaxScore.attend` (one fused SDPA call each on CPU: the ``n × m``
weights are never stored). Landmarks
and ``pinv`` run in float32 with autocast disabled (float64 stays float64); ``pinv_init`` picks the
scale of ``pinv``'s start (``per_head``, eq. 16 as written, or ``global``, the public code's;
:mod:`attention.pinv`). Cost O(nmd + m³) time, O(nm) memory. Default m = 64 (the paper's LRA
numbers use 128/256). On other devices than the CPU (CUDA; ``meta``) the same maths runs in the fused forms
(``attention.impl=fused``, :meth:`NystromAttention.fused_forward`): the landmarks one Triton kernel
(:mod:`attention.landmark_means`), ``k3 V`` and ``k1 W`` batched GEMMs split over ``n`` in the inputs' dtype
(:mod:`attention.landmark_stages`), the conv one depthwise convolution.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attention import impl, landmark_stages
from attention.landmark_means import landmark_means
from kernels.seqconv import cpu as seqconv
from attention.config_checks import check_positive_int
from attention.pinv import check_pinv_init, iterative_pinv
from kernels.common.precision import autocast_off
from attention.scores import SoftmaxScore


def segment_means(x: torch.Tensor, key_mask: torch.Tensor, m: int,
                  kernel: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask-aware segment means of ``x`` ``(B, H, n, d)`` -> landmarks ``(B, H, m, d)`` and validity ``(B, m)``; the
    sums by the C++ kernel where ``kernel`` (the ``cpu`` form) and it takes ``x``, else ``scatter_add``."""
    batch, heads, n, d = x.shape
    rank = key_mask.long().cumsum(-1) - 1  # (B, n): rank among real tokens
    n_real = key_mask.sum(-1, keepdim=True).clamp_min(1)  # (B, 1)
    segment = torch.where(key_mask, rank * m // n_real, m)  # (B, n); pads -> overflow segment m
    counts = torch.zeros(batch, m + 1, dtype=x.dtype, device=x.device).scatter_add_(
        1, segment, torch.ones_like(segment, dtype=x.dtype)
    )[:, :m]
    if kernel and seqconv.uses_kernel(x):  # one pass over x's rows, in any layout
        sums = seqconv.SegmentSums.apply(x, segment, m)
        return sums / counts.clamp_min(1)[:, None, :, None], counts > 0
    # sums over rows of x's memory, whichever layout it has (no copy): B·n rows of H·d values for the model's
    # (B, n, H, d) memory, B·H·n rows of d for contiguous (B, H, n, d); one index per row where a scatter_add over
    # (B, H, n, d) reads one per element (docs/bench.md, "Numbers kept out of the code"), same sums in the same order
    by_token = not x.is_contiguous() or x.transpose(1, 2).is_contiguous()
    offsets = torch.arange(batch * (1 if by_token else heads), device=x.device) * (m + 1)
    if by_token:
        target = (segment + offsets[:, None]).flatten()  # (B·n,)
        rows = x.transpose(1, 2).reshape(batch * n, heads * d)
    else:
        target = (segment[:, None, :] + offsets.view(batch, heads, 1)).flatten()  # (B·H·n,)
        rows = x.reshape(batch * heads * n, d)
    sums = x.new_zeros(len(offsets) * (m + 1), rows.shape[-1]).scatter_add(0, target[:, None].expand_as(rows), rows)
    if by_token:
        sums = sums.view(batch, m + 1, heads, d)[:, :m].transpose(1, 2)  # (B, H, m, d)
    else:
        sums = sums.view(batch, heads, m + 1, d)[:, :, :m]
    return sums / counts.clamp_min(1)[:, None, :, None], counts > 0


def _windows(x: torch.Tensor, block: int, width: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Rows ``[j·block, j·block + width)`` of ``x ⊙ mask`` ``(B, H, n, d)`` (``mask`` ``(B, 1, n, 1)`` or None)
    zero-padded by ``(width − block)/2`` at the start of the sequence (and to whole blocks at its end),
    transposed: ``(B, H, blocks·d, width)``. The masked rows are written once into the padded buffer (only its
    margins are zeroed), then the windows are copied out of it."""
    batch, heads, n, d = x.shape
    blocks, half = -(-n // block), (width - block) // 2
    if torch.compiler.is_compiling():  # dynamo takes no strided out=; the compiler fuses these copies itself
        padded = F.pad(x if mask is None else x * mask, (0, 0, half, blocks * block - n + half))
        return padded.unfold(2, width, block).reshape(batch, heads, blocks * d, width)
    padded = x.new_empty(batch, heads, blocks * block + width - block, d)
    padded[:, :, :half].zero_()
    padded[:, :, half + n:].zero_()
    if mask is None:
        padded[:, :, half:half + n].copy_(x)
    else:
        torch.mul(x, mask, out=padded[:, :, half:half + n])
    return padded.unfold(2, width, block).reshape(batch, heads, blocks * d, width)


def _banded_blocks(x: torch.Tensor, toeplitz: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``y[b, h, i] = Σ_t w[h, t] · (x ⊙ mask)[b, h, i + t − K//2]`` from the band ``toeplitz`` of ``w``, as a strided
    ``(B, H, blocks, block, d)`` view of whole blocks (rows past ``n`` included): its reader copies it once."""
    batch, heads, n, d = x.shape
    block, width = toeplitz.shape[-2:]
    out = _windows(x, block, width, mask) @ toeplitz.transpose(-1, -2)  # (B, H, blocks·d, block)
    return out.view(batch, heads, -1, d, block).transpose(-1, -2)


def _plus_blocks(base: torch.Tensor | None, blocks: torch.Tensor, n: int) -> torch.Tensor:
    """``base + blocks`` rows ``[0, n)`` as one contiguous ``(B, H, n, d)`` tensor (``base`` None: 0), reading the
    strided blocks once."""
    batch, heads, count, block, d = blocks.shape
    if count * block == n and base is not None and not torch.compiler.is_compiling():  # the sum keeps base's memory layout (SDPA's (B, n, H, d) on CPU)
        out = torch.empty_like(base)
        torch.add(base.view(batch, heads, count, block, d), blocks, out=out.view(batch, heads, count, block, d))
        return out
    rows = blocks.reshape(batch, heads, count * block, d)[:, :, :n]
    return rows if base is None else base + rows


class _BandedProduct(torch.autograd.Function):
    """``base + conv(x ⊙ mask)`` through :func:`_banded_blocks`, saving ``x`` only (not its ``(width/block)``×
    larger windows); ``base`` and ``mask`` may be None.

    Backward: ``∂/∂base`` is the incoming gradient, ``∂/∂x`` the same product with the reversed kernel (``T``
    flipped on both axes: the adjoint of a correlation) times the mask, ``∂/∂T = Σ_b g_blocksᵀ · windows(x ⊙ mask)``.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, toeplitz: torch.Tensor, mask: torch.Tensor | None, base: torch.Tensor | None):
        ctx.save_for_backward(x, toeplitz, mask)
        return _plus_blocks(base, _banded_blocks(x, toeplitz, mask), x.shape[2])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, toeplitz, mask = ctx.saved_tensors
        batch, heads, n, d = x.shape
        block, width = toeplitz.shape[-2:]
        blocks = -(-n // block)
        grad_x = grad_t = None
        if ctx.needs_input_grad[0]:
            grad_x = _plus_blocks(None, _banded_blocks(grad, toeplitz.flip(-1, -2)), n)
            grad_x = grad_x.contiguous() if mask is None else grad_x * mask
        if ctx.needs_input_grad[1]:
            g = F.pad(grad, (0, 0, 0, blocks * block - n)).view(batch, heads, blocks, block, d).transpose(-1, -2)
            g = g.reshape(batch, heads, blocks * d, block)
            grad_t = (g.transpose(-1, -2) @ _windows(x, block, width, mask)).sum(0)  # (H, block, width)
        return grad_x, grad_t, None, grad if ctx.needs_input_grad[3] else None


class SequenceConv(nn.Module):
    """Depthwise conv along the sequence, one kernel per head shared by the head's ``d`` channels.

    ``y[b, h, i] = Σ_t w[h, t] · x[b, h, i + t − K//2]`` with zero padding (odd ``K``: same length), i.e.
    ``F.conv1d`` over ``(B·d, H, n)`` with ``groups = H`` and ``weight`` ``(H, 1, K)``. On CPU (eager, float32/64)
    the kernels of :mod:`kernels.seqconv`; elsewhere products with a banded (Toeplitz)
    ``(block × (block + K − 1))`` matrix per head over overlapping windows of ``block`` output rows: O(n·K·d) work
    as large batched GEMMs instead of ``F.conv1d``'s depthwise loop over ``B·d`` channels (timings: docs/bench.md,
    "Numbers kept out of the code"). Checkpoints from the earlier ``nn.Conv2d`` layout (weight ``(H, 1, K, 1)``) load.
    """

    block = 32

    def __init__(self, num_heads: int, kernel_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.weight = nn.Parameter(torch.empty(num_heads, 1, kernel_size))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Conv1d's (and the former Conv2d's) init

    def toeplitz(self, dtype: torch.dtype) -> torch.Tensor:
        """``T[h, s, j] = w[h, j − s]`` for ``0 ≤ j − s < K``, else 0: ``(H, block, block + K − 1)``."""
        shift = torch.arange(self.block + self.kernel_size - 1, device=self.weight.device)[None, :]
        shift = shift - torch.arange(self.block, device=self.weight.device)[:, None]
        band = (shift >= 0) & (shift < self.kernel_size)
        return torch.where(band, self.weight[:, 0, shift.clamp(0, self.kernel_size - 1)], 0.0).to(dtype)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None, base: torch.Tensor | None = None,
                overwrite_base: bool = False, kernel: bool = True):
        """``base + conv(x ⊙ key_mask)`` ``(B, H, n, d)`` for ``x`` ``(B, H, n, d)``, ``key_mask`` bool ``(B, n)`` or
        None (all real), ``base`` ``(B, H, n, d)`` or None (0): the mask and the sum are folded into the copies
        the banded products make anyway. ``overwrite_base``: the caller's scratch ``base`` may hold the result
        (the CPU kernel writes it in place when autograd records nothing: no sequence-sized allocation). ``kernel``:
        the C++ kernels where they take ``x`` (the ``cpu`` form), else the banded products."""
        if kernel and seqconv.uses_kernel(x) and (base is None or base.stride(-1) == 1):  # CPU: mask read for free
            mask = None if key_mask is None or bool(key_mask.all()) else key_mask.to(x.dtype).contiguous()
            weight = self.weight[:, 0, :].to(x.dtype)
            if overwrite_base and base is not None and not torch.is_grad_enabled():
                return seqconv.conv(x, weight, in_mask=mask, base=base, out=base)
            return seqconv.ConvFunction.apply(x, weight, mask, base)
        mask = None if key_mask is None else key_mask[:, None, :, None].to(x.dtype)
        return _BandedProduct.apply(x, self.toeplitz(x.dtype), mask, base)

    def fused(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``conv(x ⊙ key_mask)`` ``(B, H, n, d)`` in the ``fused`` form (:mod:`attention.impl`): one depthwise
        ``F.conv2d`` over ``(B, H, n, d)`` as channels ``H`` of an ``n × d`` image with a ``K × 1`` kernel per channel
        (cuDNN's depthwise kernel on a GPU), after one masking product."""
        masked = key_mask[:, None, :, None] * x  # mask first: the product is contiguous, as the convolution wants it
        return F.conv2d(masked, self.weight[..., None].to(x.dtype), padding=(self.kernel_size // 2, 0),
                        groups=self.weight.shape[0])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        weight = state_dict.get(prefix + "weight")
        if weight is not None and weight.dim() == 4 and weight.shape[-1] == 1:  # nn.Conv2d's (H, 1, K, 1)
            state_dict[prefix + "weight"] = weight[..., 0]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"heads={self.weight.shape[0]}, kernel_size={self.kernel_size}"


class NystromAttention(nn.Module):
    """Drop-in Nyström attention with ``num_landmarks`` segment-mean landmarks (see module doc), in the forms of
    ``attention.impl`` (family ``nystrom``: :mod:`attention.impl`)."""

    impl_family = "nystrom"

    def __init__(self, num_heads: int, head_dim: int, num_landmarks: int = 64, pinv_iters: int = 6,
                 conv_kernel_size: int | None = 35, pinv_init: str = "per_head"):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.impl = "auto"  # attention.impl, set by attention.impl.configure
        self.num_landmarks = check_positive_int(num_landmarks, "num_landmarks")
        self.pinv_iters = check_positive_int(pinv_iters, "pinv_iters")
        self.pinv_init = check_pinv_init(pinv_init)
        self.score = SoftmaxScore()
        self.conv = None
        if conv_kernel_size is not None:
            size = check_positive_int(conv_kernel_size, "conv_kernel_size")
            if size % 2 == 0:
                raise ValueError(f"attention.conv_kernel_size must be odd (same-length output), got {size}")
            self.conv = SequenceConv(num_heads, size)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        out_dtype = v.dtype
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        forms = impl.forms_for(self, q)  # attention.impl (family nystrom) on this device and dtype
        with autocast_off(q.device.type):
            if forms.attention == "fused":  # n-sized stages in the inputs' dtype
                return self.fused_forward(q, k, v.to(q.dtype), key_mask, forms).to(out_dtype)
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
            m = min(self.num_landmarks, q.shape[2])
            kernel = forms.landmarks == "cpu"
            q_land, valid = segment_means(q, key_mask, m, kernel)  # (B, H, m, d), (B, m)
            k_land, _ = segment_means(k, key_mask, m, kernel)
            valid_keys = valid[:, None, None, :]
            eye = torch.eye(m, dtype=dtype, device=q.device)  # k2's rows on empty segments
            k2 = torch.where(valid[:, None, :, None], self.score(q_land, k_land, valid_keys), eye)  # (B, H, m, m)
            k3v = self.score.attend(q_land, k, key_mask[:, None, None, :], v)  # k3 V, (B, H, m, d)
            w = iterative_pinv(k2, self.pinv_iters, self.pinv_init, form=forms.pinv) @ k3v  # (B, H, m, d)
            y = self.score.attend(q, k_land, valid_keys, w)  # k1 (pinv(k2) k3 V), (B, H, n, d)
            if self.conv is not None:
                y = self.conv(v, key_mask, y, overwrite_base=True, kernel=kernel)  # y + conv(V, pad rows zeroed)
        return y.to(out_dtype)

    def fused_forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor,
                      forms: impl.Forms) -> torch.Tensor:
        """The forward in the ``fused`` form (:mod:`attention.impl`) ``(B, H, n, d)``, in the inputs' dtype (bf16 under
        autocast) where the data is ``n``-sized and float32 where it is ``m``-sized: the landmarks of ``Q`` and ``K``
        by one operator (:func:`attention.landmark_means.landmark_means`), ``k3 V`` and ``k1 W`` as batched GEMMs
        split over ``n`` (:mod:`attention.landmark_stages`), ``k2`` and its pseudo-inverse in float32 (rows of empty
        segments: identity rows, as in the CPU form), the conv by cuDNN's depthwise convolution
        (:meth:`SequenceConv.fused`)."""
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        m = min(self.num_landmarks, q.shape[2])
        # (B, H, m, d) each, float32 from the kernels; the validity of the m landmarks (B, H or 1, m)
        q_land, k_land, _, valid = landmark_means(q, k, key_mask, m, forms.landmarks)
        k2 = landmark_stages.core_weights(q_land, k_land, valid, valid)  # (B, H, m, m) float32
        k3v = landmark_stages.rows_attention(q_land.to(q.dtype), k, v, key_mask, forms.rows)  # (B, H, m, d) float32
        w = iterative_pinv(k2, self.pinv_iters, self.pinv_init, form=forms.pinv) @ k3v  # (B, H, m, d) float32
        y = landmark_stages.columns_attention(q, k_land, w, valid)  # k1 W, (B, H, n, d)
        return y if self.conv is None else y + self.conv.fused(v, key_mask)

    def extra_repr(self) -> str:
        return f"num_landmarks={self.num_landmarks}, pinv_iters={self.pinv_iters}, pinv_init={self.pinv_init!r}"
