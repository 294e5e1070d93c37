"""Performer attention: FAVOR+ (Choromanski et al., "Rethinking Attention with Performers", ICLR 2021).

The softmax kernel ``SM(x, y) = exp(xᵀy)`` is estimated with *positive random features* (§2.3, Lemma 1):
``SM(x, y) = E_ω[exp(ωᵀx − ‖x‖²/2) exp(ωᵀy − ‖y‖²/2)]``, ``ω ~ N(0, I_d)``, so with m draws
``φ⁺(x) = exp(−‖x‖²/2) / √m · (exp(ω₁ᵀx), …, exp(ω_mᵀx))`` gives ``SM(x, y) ≈ φ⁺(x)ᵀφ⁺(y)``. Queries and keys
enter scaled by ``d^{-1/4}`` each (so ``xᵀy = qᵀk/√d``), and attention is computed without the n × n matrix
(§2.2, "bidirectional"): ``Y = D̂⁻¹ (Q' (K'ᵀ V))``, ``D̂ = diag(Q' (K'ᵀ 1))``, ``Q' = φ⁺(Q/d^{1/4})``,
``K' = φ⁺(K/d^{1/4})``. The ω are *orthogonal random features* (§2.4): blocks of d exactly orthogonal
directions (QR of a Gaussian d × d matrix), each row rescaled to the norm of an independent d-dim Gaussian,
so every ω is still marginally N(0, I_d) and the estimator stays unbiased, with lower variance than i.i.d. draws (§2.4).

Shapes: ``q, k, v`` ``(B, H, n, d)``, ``key_mask`` bool ``(B, n)`` -> ``(B, H, n, d)``. Cost O(n m d) time,
O(n m) memory (m = ``num_features``); one ``(m, d)`` feature matrix shared by the heads of a layer.

Numerics (as the authors' JAX code and performer-pytorch): the exponents are shifted by a maximum before
``exp`` (per query over its m features; per (batch, head) over the real keys' features), a shift that cancels
in ``D̂⁻¹`` and is detached; ``eps`` is added to every feature after ``exp`` (the authors' JAX code: 1e-6,
performer-pytorch: 1e-4); ``eps = 0`` is the plain estimator. Computed in at least float32 (autocast off).

Padding: pad keys' features are zeroed (after ``eps``) and the key shift is a maximum over real keys only,
so appending pads changes no real token's output. performer-pytorch only zeroes pad *values*, so pads still
enter its normaliser ``D̂``; we leave them out (pads are not tokens).

Redraw policy (``redraw_interval``): 0 keeps the features drawn at construction (from ``seed``: a test can
copy them into a reference); k > 0 draws new ones, from the device's default generator, every k-th training
forward (performer-pytorch's ``feature_redraw_interval``, default 1000; the paper's experiments redraw
periodically during training). The draw and the choice run as tensor ops every training step (a few d × d QRs,
small against the attention), with the step counter a buffer, so there is no host sync and ``torch.compile``
sees one graph. The tables' runs went through Nyströmformer's LRA code (mlpen/Nystromformer,
``LRA/code/attention_performer.py``; the Proxyformer paper's Table 1 builds on it), which calls performer-pytorch's
``FastAttention`` directly, without its ``ProjectionUpdater``: its features are never redrawn, so the default here
is 0, never. That file differs from this module, and from the paper, in two ways we do not copy:

* it scales ``Q`` and ``K`` by ``d^{-1/4}`` before ``FastAttention``, whose ``softmax_kernel`` scales them by
  ``d^{-1/4}`` again (``normalize_data=True``), so it estimates ``exp(qᵀk / d)``, not ``exp(qᵀk / √d)``: scores
  √d times flatter (√32 at the LRA head dim of 32);
* it masks pads by zeroing their keys and values, so each pad stays in ``D̂`` as a key of score 0 (weight
  ``exp(0)``): its ListOps examples are padded to 2,048 tokens (``LRA/datasets/listops.py``: LRA's 2,000 and 48
  zeros), so every sequence shorter than that gets a share of its attention weight sent to zero values.

Its config's ``kernel_type: relu`` changes nothing (``kernel_fn`` is read only with ``generalized_attention``).
``lra_code=True`` computes what that file computes (with ``eps=1e-4``, performer-pytorch's): ``Q, K`` scaled by
``d^{-1/2}``, pad keys and values zeroed and counted in ``D̂``, the key shift over every key. It exists to test
whether those two differences explain the tables' below-chance Performer (docs/results.md); padding changes real
tokens' outputs in it, by construction.

Defaults: 256 features (the LRA paper's and the CUR table's Performer, Proxyformer's "Performer-256*");
Proxyformer's "Performer-128" row is ``attention.num_features=128``.
"""

from __future__ import annotations

import torch
from torch import nn

from attention.config_checks import check_positive_int
from kernels.common.precision import autocast_off


def orthogonal_gaussian_features(num_features: int, dim: int, *, generator: torch.Generator | None = None,
                                 device=None, dtype=torch.float32) -> torch.Tensor:
    """``(num_features, dim)`` rows ω: ⌈m/d⌉ blocks of d orthonormal rows (QR of Gaussian d × d matrices, in one
    batched call), the first m rows kept, row i rescaled to the norm of its own Gaussian d-vector (§2.4).

    The Q factor's columns are multiplied by the signs of R's diagonal: LAPACK's Householder QR does not make
    that diagonal positive, and without the correction the directions are not uniform on the sphere, so the
    estimator is biased (d = 4, 65,536 features: 28 % max relative error of exp(xᵀy) against 2.4 % with the
    correction and 2.6 % with i.i.d. features; performer-pytorch 1.1.4 and the JAX code omit it)."""
    blocks = -(-num_features // dim)
    gaussian = torch.randn(blocks, dim, dim, generator=generator, device=device, dtype=dtype)
    q, r = torch.linalg.qr(gaussian)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # Haar-distributed (see docstring)
    orthogonal = q.transpose(-1, -2).reshape(blocks * dim, dim)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator, device=device, dtype=dtype).norm(dim=-1)
    return orthogonal * norms[:, None]


def positive_features(x: torch.Tensor, omega: torch.Tensor, eps: float, real: torch.Tensor | None) -> torch.Tensor:
    """φ⁺(x) of Lemma 1 for ``x`` ``(B, H, n, d)`` already scaled by d^{-1/4}: ``(B, H, n, m)``.

    ``real`` None: queries, shifted per row; else ``(B, 1, n, 1)`` bool: keys, shifted by the max over real
    keys and features of each (batch, head), pads zeroed."""
    projected = x @ omega.T  # (B, H, n, m): ωᵀx
    exponent = projected - 0.5 * x.square().sum(-1, keepdim=True)
    if real is None:
        shift = projected.amax(-1, keepdim=True)
    else:
        shift = projected.masked_fill(~real, -torch.inf).amax((-1, -2), keepdim=True)
        shift = torch.where(torch.isfinite(shift), shift, 0.0)  # no real key: any finite shift (all features are 0)
    features = (torch.exp(exponent - shift.detach()) + eps) * omega.shape[0] ** -0.5
    return features if real is None else features * real


class PerformerAttention(nn.Module):
    """FAVOR+ bidirectional attention with positive orthogonal random features (see the module docstring)."""

    def __init__(self, num_heads: int, head_dim: int, num_features: int = 256, redraw_interval: int = 0,
                 eps: float = 1e-6, seed: int = 0, lra_code: bool = False):
        super().__init__()
        check_positive_int(num_features, "num_features")
        if isinstance(redraw_interval, bool) or not isinstance(redraw_interval, int) or redraw_interval < 0:
            raise ValueError(f"attention.redraw_interval must be an integer >= 0 (0: never redraw), got {redraw_interval!r}")
        if not eps >= 0.0:
            raise ValueError(f"attention.eps must be >= 0, got {eps!r}")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.redraw_interval = redraw_interval
        self.eps = eps
        if not isinstance(lra_code, bool):
            raise ValueError(f"attention.lra_code must be true or false, got {lra_code!r}")
        self.lra_code = lra_code
        generator = torch.Generator().manual_seed(seed)
        self.register_buffer("features", orthogonal_gaussian_features(num_features, head_dim, generator=generator))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    def redraw(self) -> None:
        """Every ``redraw_interval``-th call (counted in a buffer) replaces the features with a fresh draw."""
        fresh = orthogonal_gaussian_features(*self.features.shape, device=self.features.device, dtype=self.features.dtype)
        due = (self.step % self.redraw_interval == 0) & (self.step > 0)
        self.features.copy_(torch.where(due, fresh, self.features))
        self.step.add_(1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        if self.training and self.redraw_interval > 0:
            self.redraw()
        dtype = torch.promote_types(q.dtype, torch.float32)
        with autocast_off(q.device.type):
            omega = self.features.to(dtype)
            real = key_mask[:, None, :, None]
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
            if self.lra_code:  # mlpen/Nystromformer's LRA code (module docstring): d^{-1/4} twice, pads as zero keys
                scale, k, v, keys = self.head_dim**-0.5, k * real, v * real, torch.ones_like(real)
            else:
                scale, keys = self.head_dim**-0.25, real
            q_prime = positive_features(q * scale, omega, self.eps, None)  # (B, H, n, m)
            k_prime = positive_features(k * scale, omega, self.eps, keys)  # (B, H, n, m), pads 0 (lra_code: φ(0))
            context = k_prime.transpose(-1, -2) @ v  # (B, H, m, d): K'ᵀ V
            normaliser = q_prime @ k_prime.sum(-2).unsqueeze(-1)  # (B, H, n, 1): Q' (K'ᵀ 1)
            out = (q_prime @ context) / normaliser.clamp_min(torch.finfo(dtype).tiny)
        return out.to(q.dtype)
