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
Cost O(n m d) time per head; the fused products (``ProxyAttention``) store O(n d + m d) per head, not the
O(n m) of K₁ and K₂ (element dropout, ``k1`` / ``k2``, forms the matrix it drops from).

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

from attention.config_checks import check_choice, check_dropout, check_positive_int

DROPOUT_MODES = ("none", "k1", "k2", "decomposed")


def landmark_contrastive_loss(landmarks: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 7–8 over landmarks ``(..., m, d)``: mean over leading dims and the m rows of
    ``-log softmax(z zᵀ/τ)ᵢᵢ`` with ``z`` the row-normalised landmarks."""
    z = F.normalize(landmarks.to(torch.promote_types(landmarks.dtype, torch.float32)), dim=-1)
    logits = z @ z.transpose(-1, -2) / tau  # (..., m, m)
    return -torch.diagonal(logits.log_softmax(dim=-1), dim1=-2, dim2=-1).mean()


def inject_input(proxies: torch.Tensor, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """Eq. 11: ``P + softmax(P Xᵀ/√d) X`` over real tokens; ``proxies`` ``(B, m, d)``, ``x`` ``(B, n, d)``,
    ``key_mask`` bool ``(B, n)`` -> ``(B, m, d)``. Called with one head, 4-D, so that the fused kernel runs (3-D
    inputs take PyTorch's math path, which forms the m × n weights)."""
    mask = key_mask[:, None, None, :]  # (B, 1, 1, n)
    return proxies + F.scaled_dot_product_attention(proxies[:, None], x[:, None], x[:, None], attn_mask=mask)[:, 0]


class DecomposedDropout(nn.Module):
    """Dropout on the decomposed attention ``K₁`` ``(B, H, n, m)`` / ``K₂`` ``(B, H, m, n)`` (Fig. 5).

    ``mode``: ``none``; ``k1`` / ``k2``: ordinary element dropout on that matrix (``elements``, so the
    attention forms that matrix); ``decomposed``: key column ``j`` of K₂ zeroed for all m landmarks at once,
    which removes column j of the reconstructed ``K₁ K₂`` entirely. As ``K₂ diag(c) V = K₂ (c ⊙ V)``,
    ``drop_keys`` applies that column mask to the rows of ``V`` ``(B, H, n, d)``: mask ``(B, H, n, 1)``,
    the same uniforms in the same order as a ``(B, H, 1, n)`` column mask. Masks are ``1[u ≥ p]/(1 − p)``
    with ``u ~ U[0, 1)``; nothing is dropped in eval mode.
    """

    def __init__(self, mode: str, p: float):
        super().__init__()
        check_choice(mode, DROPOUT_MODES, "dropout_mode")
        check_dropout(p)
        self.mode = mode
        self.p = p

    def drops(self, mode: str) -> bool:
        """Whether dropout of kind ``mode`` is active: it is this module's mode, training, ``p > 0``."""
        return self.training and self.p > 0.0 and self.mode == mode

    def _drop(self, x: torch.Tensor, mask_shape: tuple[int, ...]) -> torch.Tensor:
        keep = torch.rand(mask_shape, device=x.device) >= self.p
        return x * keep.to(x.dtype).div_(1.0 - self.p)

    def drop_keys(self, v: torch.Tensor) -> torch.Tensor:
        """``decomposed`` mode: whole rows of ``v`` ``(B, H, n, d)`` (= key columns of K₂); else ``v``."""
        if not self.drops("decomposed"):
            return v
        batch, heads, n, _ = v.shape
        return self._drop(v, (batch, heads, n, 1))

    def elements(self, weights: torch.Tensor) -> torch.Tensor:
        """Element dropout on ``weights`` (K₁ or K₂, whichever ``drops("k1" / "k2")`` names)."""
        return self._drop(weights, weights.shape)


class ProxyAttention(nn.Module):
    """Alg. 3 for ``heads`` heads plus the Proxyformer settings the model reads from it.

    ``forward(q, k, v, key_mask, landmarks)``: ``q, k, v`` ``(B, H, n, d)`` of the input tokens,
    ``key_mask`` bool ``(B, n)``, ``landmarks`` ``(B or 1, H, m, d)`` -> ``[Y_p; Y_x]`` ``(B, H, m + n, d)``
    (a view of a ``(B, m + n, H, d)`` tensor, so merging heads copies nothing).
    ``contrastive_loss(landmarks)`` gives the weighted Eq. 8 term (None when off) and ``inject`` applies
    Eq. 11 when ``injection`` is on; ``num_proxies`` is the m that ``models.proxyformer`` allocates.

    Both products are fused softmax-attention calls (``F.scaled_dot_product_attention``, on CPU PyTorch's
    flash kernel): ``Y_p = SDPA(L, K, V, pad mask)``, ``Y_x = SDPA(Q, L, Y_p)``, so neither K₁ nor K₂ is
    stored, and the backward recomputes them block by block. Decomposed dropout rides on ``V``
    (``DecomposedDropout.drop_keys``); only element dropout (``k1`` / ``k2`` while training) forms its matrix.
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
        check_positive_int(num_proxies, "num_proxies")
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
        pad_mask = key_mask[:, None, None, :]  # (B, 1, 1, n)
        y_p = self.softmax_product(landmarks, k, self.dropout.drop_keys(v), pad_mask, "k2")  # K₂ V: (B, H, m, d)
        y_x = self.softmax_product(q, landmarks, y_p, None, "k1")  # K₁ Y_p: (B, H, n, d)
        return torch.cat([y_p.transpose(1, 2), y_x.transpose(1, 2)], dim=1).transpose(1, 2)

    def softmax_product(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, matrix: str
    ) -> torch.Tensor:
        """``softmax(query keyᵀ/√d + mask) value`` with ``query`` ``(B, H, r, d)``, ``key, value`` ``(B, H, c, d)``,
        bool ``mask`` broadcasting to ``(B, H, r, c)`` (True = attend) or None -> ``(B, H, r, d)``. Fused unless
        element dropout on ``matrix`` (``"k1"`` for K₁, ``"k2"`` for K₂) is active, which needs the weights."""
        scale = 1.0 / math.sqrt(self.head_dim)
        if not self.dropout.drops(matrix):
            return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
        scores = (query * scale) @ key.transpose(-1, -2)  # (B, H, r, c), a fresh tensor: masked in place
        if mask is not None:
            scores.masked_fill_(~mask, float("-inf"))
        return self.dropout.elements(torch.softmax(scores, dim=-1)) @ value

    def contrastive_loss(self, landmarks: torch.Tensor) -> torch.Tensor | None:
        """``contrastive_weight ×`` Eq. 8 on ``landmarks`` ``(B or 1, H, m, d)``; None when switched off."""
        if not self.contrastive:
            return None
        return self.contrastive_weight * landmark_contrastive_loss(landmarks, self.tau)

    def inject(self, proxies: torch.Tensor, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """Eq. 11 (``inject_input``) when ``injection`` is on, else ``proxies`` unchanged; shapes as there."""
        return inject_input(proxies, x, key_mask) if self.injection else proxies
