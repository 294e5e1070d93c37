"""Bidirectional multi-dimensional damped EMA of MEGA (Ma et al. 2022, §3.1; docs/design.md §2 "MEGA and MegaCUR").

Per channel ``d`` and EMA dimension ``n`` (``ndim`` of them) the damped EMA is
``u_t = p ⊙ β x_t + (1 − p ⊙ σ(δ)) ⊙ u_{t−1}``, projected back by ``η``; unrolled it is the
convolution of ``x`` with the kernel

    k[d, l] = Σₙ η[d, n] · √(1/ndim) · p[d, n] · β[d, n] · q[d, n]^l,   p = σ(α),  q = 1 − p·σ(δ),

with ``l = 0 .. L−1`` the lag. The bidirectional EMA has one kernel per direction
(``k_fwd`` looks back, ``k_bwd`` looks ahead):

    y[t] = Σ_{j ≤ t} k_fwd[t − j] x[j] + Σ_{j ≥ t + s} k_bwd[j − t] x[j]

``shift`` (s = 1) drops the backward kernel's lag 0, as facebookresearch/mega's ``MultiHeadEMA``
(``fairseq/modules/exponential_moving_average.py``, ``shift=True``, the value its LRA encoder uses);
``shift=False`` (s = 0) keeps lag 0 in both directions (our original form). ``truncation`` K keeps
only lags ``l < min(K, L)`` (the reference's ``--truncation-length``, 1024 in its LRA architectures
``fairseq/models/lra/model.py``); ``None`` keeps all ``L`` lags.

computed in O(L log L) by real FFTs of length 2L over time (:class:`BidirectionalConvolution`, with its
own backward): the forward part is a product of spectra and the backward part a correlation (product with
the conjugate spectrum); length 2L makes both linear, not circular. The block output is ``silu(y + ω ⊙ x)``.

Decisions: pad positions (``key_mask`` False) are zeroed before the convolution so the EMA of a
real token never sees padding in either direction; the FFT runs in at least float32 (also under
autocast). Parameter initialisation follows the reference code (α, δ ~ N(0, 0.2²), β ~ 1 ± 0.02
with alternating sign over ``n``, η, ω ~ N(0, 1)). There every dimension starts with ``p ≈ σ(δ) ≈ 0.5``, a
decay time ``1/(1 − q) = 1/(p·σ(δ)) ≈ 4`` tokens. ``timescales = (τ_min, τ_max)`` (``model.block.ema_timescales``)
instead draws ``τ`` log-uniform in that range per (direction, channel, dimension) and sets ``p = σ(α) = 1/τ``
(δ as the reference), so the decay times ``τ/σ(δ) ≈ 2τ`` span short and sequence-long memories from the
start, as S4D's log-uniform step sizes do (Gu et al. 2022, "On the Parameterization and Initialization of
Diagonal State Space Models": Δ ~ LogUniform(0.001, 0.1), timescales 10–1000); the steady-state gain
``p·β/(1 − q) = β/σ(δ)`` stays ≈ 2 whatever ``τ``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kernels.common.precision import autocast_off


class BidirectionalEMA(nn.Module):
    """``forward(x (B, L, D), key_mask (B, L)) -> (B, L, D)``; parameters ``(2, D, ndim)`` (direction first)."""

    lag_block = 64  # s of :meth:`kernel`'s lags l = s·b + j (√2000 ≈ 45 would minimise its exps at L = 2000)

    def __init__(self, d_model: int, ndim: int = 16, truncation: int | None = None, shift: bool = False,
                 timescales: tuple[float, float] | None = None):
        super().__init__()
        if ndim < 1:
            raise ValueError(f"model.block.ndim (EMA dimension) must be >= 1, got {ndim}")
        if truncation is not None and truncation < 1:
            raise ValueError(f"model.block.ema_truncation must be null (all lags) or >= 1, got {truncation}")
        if timescales is not None and (len(timescales) != 2 or not 1 < timescales[0] <= timescales[1]):
            raise ValueError(f"model.block.ema_timescales must be [low, high] with 1 < low <= high (tokens), got "
                             f"{list(timescales)}; null keeps MEGA's initialisation")
        self.d_model = d_model
        self.ndim = ndim
        self.truncation = truncation
        self.shift = shift
        self.alpha = nn.Parameter(torch.randn(2, d_model, ndim) * 0.2 if timescales is None
                                  else -torch.log(log_uniform_timescales((2, d_model, ndim), *timescales) - 1))
        self.delta = nn.Parameter(torch.randn(2, d_model, ndim) * 0.2)
        signs = torch.ones(ndim)
        signs[1::2] = -1.0
        self.beta = nn.Parameter(torch.randn(2, d_model, ndim) * 0.02 + signs)
        self.eta = nn.Parameter(torch.randn(2, d_model, ndim))
        self.omega = nn.Parameter(torch.randn(d_model))

    def kernel(self, length: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``k[direction, d, l]`` for lags ``l < length``: ``(2, D, length)``.

        With lags written ``l = s·b + j`` (``s`` = :attr:`lag_block`, ``j < s``), ``q^l = q^{s·b} · q^j``, so
        ``k[·, b·s + j] = Σₙ (w ⊙ q^{s·b})[n, b] · (q^j)[n, j]``: one batched ``(blocks × ndim) @ (ndim × s)``
        product over two exp tables of ``⌈length / s⌉`` and ``s`` columns, instead of ``2·D·ndim·length`` exps
        (each table entry is rounded as ``exp(l·log q)`` is, plus one product). The powers tensor of that size
        also held ~3 % subnormal values (``q^l`` under 1.2e-38 at long lags), and on x86 an ``exp`` or a product
        with a subnormal result takes a microcode-assisted path, far slower per element.
        """
        alpha, delta, beta, eta = (p.to(dtype) for p in (self.alpha, self.delta, self.beta, self.eta))
        p = torch.sigmoid(alpha)
        log_q = torch.log1p(-p * torch.sigmoid(delta)).unsqueeze(-1)  # log of the decay per step, q in (0, 1)
        step = self.lag_block
        blocks = (length + step - 1) // step  # also for a symbolic length under torch.compile
        coarse = torch.exp(torch.arange(blocks, device=p.device, dtype=dtype) * step * log_q)  # (2, D, ndim, blocks)
        fine = torch.exp(torch.arange(step, device=p.device, dtype=dtype) * log_q)  # (2, D, ndim, s) = q^j
        weights = eta * math.sqrt(1.0 / self.ndim) * p * beta  # (2, D, ndim)
        k = (weights.unsqueeze(-1) * coarse).transpose(-1, -2) @ fine  # (2, D, blocks, s)
        return k.flatten(-2)[..., :length]

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        dtype = torch.promote_types(x.dtype, torch.float32)
        with autocast_off(x.device.type):
            signal = x.to(dtype) * key_mask.unsqueeze(-1).to(dtype)  # (B, L, D), pads zeroed
            lags = length if self.truncation is None else min(self.truncation, length)
            k_fwd, k_bwd = self.kernel(lags, dtype)  # (D, lags) each
            if self.shift:
                k_bwd = F.pad(k_bwd[:, 1:], (1, 0))  # no lag 0 looking ahead
            y = BidirectionalConvolution.apply(signal, k_fwd, k_bwd)  # (B, L, D)
            out = F.silu(torch.addcmul(y, self.omega.to(dtype), signal))
        return out.to(x.dtype)


def log_uniform_timescales(shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
    """``τ`` of the given shape, ``log τ ~ U(log low, log high)``; α = logit(1/τ) = −log(τ − 1) needs ``low > 1``."""
    return torch.exp(torch.empty(shape).uniform_(math.log(low), math.log(high)))


class BidirectionalConvolution(torch.autograd.Function):
    """``y[t] = Σ_{j ≤ t} k_fwd[t − j] x[j] + Σ_{j ≥ t} k_bwd[j − t] x[j]`` for ``x (B, L, D)``, ``k_fwd, k_bwd
    (D, K)`` (``K ≤ L`` lags) -> ``y (B, L, D)``, through real FFTs of length ``N = 2L`` (linear, not circular).

    With ``X = rfft(x)``, ``R = rfft(k_fwd) + conj(rfft(k_bwd))``, ``G = rfft(∂y)`` (all over time, length N):
    ``y = irfft(X R)``, ``∂x = irfft(G conj(R))``, ``∂k_fwd[l] = Σ_{b,t} ∂y[t] x[t − l] = irfft(Σ_b G conj(X))[l]``,
    ``∂k_bwd[l] = Σ_{b,t} ∂y[t] x[t + l] = irfft(Σ_b X conj(G))[l]`` (the wrap-around of length N reads only
    zero padding for lags < L). Autograd through ``rfft`` would instead run a full-length complex FFT of the
    padded gradient (``fft_r2c_backward``), the largest single cost of a MEGA training step on CPU.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, k_fwd: torch.Tensor, k_bwd: torch.Tensor) -> torch.Tensor:
        length, lags = x.shape[1], k_fwd.shape[-1]
        size = 2 * length
        spectrum = torch.fft.rfft(x.transpose(1, 2), n=size)  # (B, D, N/2 + 1); FFTs over the last dim are fastest
        response = torch.fft.rfft(k_fwd, n=size) + torch.fft.rfft(k_bwd, n=size).conj()  # (D, N/2 + 1)
        ctx.save_for_backward(spectrum, response)
        ctx.length, ctx.lags = length, lags
        return torch.fft.irfft(spectrum * response, n=size)[..., :length].transpose(1, 2).contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        spectrum, response = ctx.saved_tensors
        length, lags, size = ctx.length, ctx.lags, 2 * ctx.length
        grad_spectrum = torch.fft.rfft(grad.transpose(1, 2), n=size)  # (B, D, N/2 + 1)
        grad_x = torch.fft.irfft(grad_spectrum * response.conj(), n=size)[..., :length].transpose(1, 2)
        grad_k_fwd = grad_k_bwd = None
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            cross = (grad_spectrum * spectrum.conj()).sum(0)  # (D, N/2 + 1): Σ_b G conj(X)
            grad_k_fwd = torch.fft.irfft(cross, n=size)[:, :lags]
            grad_k_bwd = torch.fft.irfft(cross.conj(), n=size)[:, :lags]
        return grad_x, grad_k_fwd, grad_k_bwd
