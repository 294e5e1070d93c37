"""Proxyformer attention (Lee, Lee, Shin, AAAI 2024, §3 and Alg. 3): the per-head math.

Learned proxy tokens ``P`` ride as a prefix ``[P; X]`` through every block (``models/proxyformer.py``);
per head, with landmarks ``L = P W_L`` ``(m, d)`` and the input's ``Q, K, V`` ``(n, d)``:

* ``K₁ = softmax(Q Lᵀ/√d)`` ``(n, m)``; ``K₂ = softmax(L Kᵀ/√d + pad mask)`` ``(m, n)`` (Alg. 3, l. 2–3)
* ``Y_p = K₂ V`` ``(m, d)``; ``Y_x = K₁ Y_p`` ``(n, d)``; output ``[Y_p; Y_x]`` (Alg. 3, l. 4–6)
* no pseudo-inverse: the contrastive loss drives ``softmax(L Lᵀ/√d) ≈ I`` (Eq. 10)
* contrastive loss (Eq. 7–8): ``zᵢ = Lᵢ/‖Lᵢ‖``, cross-entropy of ``z zᵀ/τ`` with the identity as target
* injection before the first layer (Eq. 11): ``P = P + softmax(P Xᵀ/√d_model) X``, pad tokens masked
* dropout on the decomposed matrices (Fig. 5, Table 3): ``none``, ``k1`` / ``k2`` (ordinary dropout on
  the entries of K₁ / K₂) or ``decomposed`` (whole key columns of K₂, the paper's proposal)

Defaults (paper §4): m = 128, τ = 0.07, p = 0.1, decomposed dropout, contrastive and injection on.
Cost O(n m d) time and O(n m + m d) memory per head.

Decisions (the paper leaves them open):
* Eq. 8 writes ``1/m Σᵢ`` and ``-Σᵢ`` together; we take the mean over the m landmarks (cross-entropy).
* the contrastive loss is computed per sequence and head on that head's ``L`` (``d = head_dim``) and
  averaged over batch and heads; after the first layer (or with injection) ``L`` depends on the input.
* dropout masks are drawn independently per sequence and head, scaled by ``1/(1-p)`` (inverted dropout),
  with no renormalisation of the softmax rows, as ordinary attention dropout does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

DROPOUT_MODES = ("none", "k1", "k2", "decomposed")


def landmark_contrastive_loss(landmarks: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 7–8 over landmarks ``(..., m, d)``: mean over leading dims and the m rows of
    ``-log softmax(z zᵀ/τ)ᵢᵢ`` with ``z`` the row-normalised landmarks."""
    z = F.normalize(landmarks.to(torch.promote_types(landmarks.dtype, torch.float32)), dim=-1)
    logits = z @ z.transpose(-1, -2) / tau  # (..., m, m)
    return -torch.diagonal(logits.log_softmax(dim=-1), dim1=-2, dim2=-1).mean()


def inject_input(proxies: torch.Tensor, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """Eq. 11: ``P + softmax(P Xᵀ/√d) X`` over real tokens; ``proxies`` ``(B, m, d)``, ``x`` ``(B, n, d)``,
    ``key_mask`` bool ``(B, n)`` -> ``(B, m, d)``."""
    mask = key_mask[:, None, :]  # (B, 1, n)
    return proxies + F.scaled_dot_product_attention(proxies, x, x, attn_mask=mask)


class DecomposedDropout(nn.Module):
    """Dropout on the decomposed attention ``K₁`` ``(B, H, n, m)`` / ``K₂`` ``(B, H, m, n)`` (Fig. 5).

    ``mode``: ``none``; ``k1`` / ``k2``: ordinary element dropout on that matrix; ``decomposed``: a
    key column ``j`` of K₂ is zeroed for all m landmarks at once (mask ``(B, H, 1, n)``), which removes
    column j of the reconstructed ``K₁ K₂`` entirely. Identity in eval mode.
    """

    def __init__(self, mode: str, p: float):
        super().__init__()
        if mode not in DROPOUT_MODES:
            raise ValueError(f"attention.dropout_mode must be one of {DROPOUT_MODES}, got {mode!r}")
        if not 0.0 <= p < 1.0:
            raise ValueError(f"attention.dropout must be in [0, 1), got {p}")
        self.mode = mode
        self.p = p

    def _drop(self, weights: torch.Tensor, mask_shape: tuple[int, ...]) -> torch.Tensor:
        keep = torch.rand(mask_shape, device=weights.device) >= self.p
        return weights * keep.to(weights.dtype) / (1.0 - self.p)

    def forward(self, k1: torch.Tensor, k2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.training or self.p == 0.0 or self.mode == "none":
            return k1, k2
        if self.mode == "k1":
            return self._drop(k1, k1.shape), k2
        if self.mode == "k2":
            return k1, self._drop(k2, k2.shape)
        batch, heads, _, n = k2.shape
        return k1, self._drop(k2, (batch, heads, 1, n))


class ProxyAttention(nn.Module):
    """Alg. 3 for ``heads`` heads plus the Proxyformer settings the model reads from it.

    ``forward(q, k, v, key_mask, landmarks)``: ``q, k, v`` ``(B, H, n, d)`` of the input tokens,
    ``key_mask`` bool ``(B, n)``, ``landmarks`` ``(B or 1, H, m, d)`` -> ``[Y_p; Y_x]`` ``(B, H, m + n, d)``.
    ``contrastive_loss(landmarks)`` gives the weighted Eq. 8 term (None when off) and ``inject`` applies
    Eq. 11 when ``injection`` is on; ``num_proxies`` is the m that ``models.proxyformer`` allocates.
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_proxies: int = 128,
        tau: float = 0.07,
        contrastive: bool = True,
        contrastive_weight: float = 1.0,
        dropout_mode: str = "decomposed",
        dropout: float = 0.1,
        injection: bool = True,
    ):
        super().__init__()
        if num_proxies < 1:
            raise ValueError(f"attention.num_proxies must be >= 1, got {num_proxies}")
        if tau <= 0:
            raise ValueError(f"attention.tau must be > 0, got {tau}")
        if contrastive_weight < 0:
            raise ValueError(f"attention.contrastive_weight must be >= 0, got {contrastive_weight}")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_proxies = num_proxies
        self.tau = tau
        self.contrastive = contrastive
        self.contrastive_weight = contrastive_weight
        self.injection = injection
        self.dropout = DecomposedDropout(dropout_mode, dropout)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor, landmarks: torch.Tensor | None = None
    ) -> torch.Tensor:
        if landmarks is None:
            raise ValueError(
                "Proxyformer attention needs the proxy landmarks L (forward(q, k, v, key_mask, landmarks)); "
                "it runs inside models.proxyformer.ProxyEncoder: use attention=proxyformer without overriding "
                "model= (configs/attention/proxyformer.yaml selects model=proxyformer)"
            )
        if landmarks.shape[-2] != self.num_proxies:
            raise ValueError(f"got {landmarks.shape[-2]} landmarks, expected attention.num_proxies={self.num_proxies}")
        scale = 1.0 / math.sqrt(self.head_dim)
        k1 = torch.softmax(q @ landmarks.transpose(-1, -2) * scale, dim=-1)  # (B, H, n, m)
        scores = landmarks @ k.transpose(-1, -2) * scale  # (B, H, m, n)
        k2 = torch.softmax(scores.masked_fill(~key_mask[:, None, None, :], float("-inf")), dim=-1)
        k1, k2 = self.dropout(k1, k2)
        y_p = k2 @ v  # (B, H, m, d)
        y_x = k1 @ y_p  # (B, H, n, d)
        return torch.cat([y_p, y_x], dim=2)

    def contrastive_loss(self, landmarks: torch.Tensor) -> torch.Tensor | None:
        """``contrastive_weight ×`` Eq. 8 on ``landmarks`` ``(B or 1, H, m, d)``; None when switched off."""
        if not self.contrastive:
            return None
        return self.contrastive_weight * landmark_contrastive_loss(landmarks, self.tau)

    def inject(self, proxies: torch.Tensor, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """Eq. 11 (``inject_input``) when ``injection`` is on, else ``proxies`` unchanged; shapes as there."""
        return inject_input(proxies, x, key_mask) if self.injection else proxies
