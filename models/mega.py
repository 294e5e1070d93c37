"""The MEGA block (Ma et al. 2022, §3; facebookresearch/mega ``MovingAverageGatedAttention`` and
``NormalizedFeedForwardNetwork`` in ``fairseq/modules/``; docs/design.md §2 "MEGA and MegaCUR").

Moving-average gated attention followed by a SiLU FFN, each a residual sub-layer with a norm
before it (``prenorm: true``, MEGA's ``--encoder-normalize-before``, its Image/Pathfinder setting)
or after the residual sum (``prenorm: false``, MEGA's ListOps/Text/Retrieval setting). With
``X = norm(x)`` (pre-norm) or ``X = x`` (post-norm), ``x`` ``(B, n, d_model)``:

    V  = drop_h(silu(X W_v))                            (B, n, hidden_dim)
    X' = drop(EMA(X))   (bidirectional, models/ema.py)   (B, n, d_model)
    u, z, r, hx = split(X' W_mx):  u = σ(·) (update gate), z, r = silu(·) (z_dim, hidden_dim)
    Q = z·γ₀ + β₀,  K = z·γ₁ + β₁                        (B, n, z_dim)
    O  = attn(Q, K, V)     single head, relative bias, softmax or laplace, exact or CUR
    h  = drop(silu(hx + W_h(O ⊙ r)))
    y  = x + u ⊙ (h − x)                      (post-norm: y = norm(y))
    y' = y + drop(W₂ drop_h(silu(W₁ norm(y))))  (post-norm: norm(y + drop(W₂ drop_h(silu(W₁ y)))))

``drop`` is ``model.dropout`` (MEGA's ``--dropout``), ``drop_h`` is ``hidden_dropout`` (MEGA's
``--act-dropout``, 0 in all its LRA commands). Attention-weight dropout (``--attention-dropout``) is
0 in every MEGA LRA command and is not implemented: ``attention_dropout`` must be 0.

Norms (``norm``; MEGA's ``--norm-type``, ``fairseq/modules/sequence_norm.py``): ``layer``
(LayerNorm), ``scale`` (ScaleNorm: ``g · x / sqrt(mean(x²) + eps)``, one learned scalar g, as
``fairseq/modules/scale_norm.py``) or ``batch`` (BatchNorm1d over batch and positions). **Decision:**
batch norm takes its statistics over real tokens only (MEGA's batch-norm tasks have no padding, so
this equals the reference there). The encoder's final norm (pre-norm only in MEGA) is built by
``sequence_norm`` too (``model.final_norm``).

Chunking (``chunk_size`` c, MEGA-chunk): the sequence is padded to a multiple of c and attention
runs inside each chunk (positions restart at 0 in each chunk), cost O(n c); the EMA still spans
the whole sequence. With c ≥ n it equals unchunked attention. ``chunk_size: null`` = one chunk.

``attention`` is the attention factory (``attention(num_heads=1, head_dim=z_dim)``, see
``lra.build.attention_factory``). ``attention_function`` (``softmax`` | ``laplace`` | null) is handed to
it as ``function=`` (null keeps the attention config's): MEGA's ``--attention-activation-fn`` is a
per-task model setting (``configs/mega_protocol/<task>.yaml``).

The block is single-head: ``model.num_heads`` must be 1. Initialisation follows the reference code
(N(0, 0.02²) weights, zero biases, γ ~ N(0, 0.02²), β = 0).
"""

from __future__ import annotations

import itertools
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attention.mega import Laplace, Softmax
from models.dropout import Dropout
from models.ema import BidirectionalEMA

NORMS = ("layer", "scale", "batch")
FUNCTIONS = {"softmax": Softmax, "laplace": Laplace}


class ScaleNorm(nn.Module):
    """``g · x / sqrt(mean(x², -1) + eps)`` with one learned scalar ``g`` (init 1; MEGA ``scale_norm.py``)."""

    def __init__(self, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.scale * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class MaskedBatchNorm(nn.BatchNorm1d):
    """BatchNorm1d over ``(B, n, d)`` with statistics over real tokens (all tokens when ``key_mask`` is None);
    pad rows come back as zeros. MEGA normalises ``(B, d, n)`` with BatchNorm1d (no padding in its tasks)."""

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        if key_mask is None:
            return super().forward(x.reshape(-1, x.shape[-1])).view_as(x)
        out = x.new_zeros(x.shape)
        out[key_mask] = super().forward(x[key_mask])  # (N_real, d)
        return out


def sequence_norm(d_model: int, kind: str | None = "layer") -> nn.Module:
    """``layer | scale | batch`` norm over the last dim (eps 1e-5 as MEGA's ``SequenceNorm``); also the
    encoder's ``model.final_norm`` factory, where ``kind: null`` is no norm (MEGA's post-norm encoders
    have no final norm). LayerNorm keeps its usual state-dict keys."""
    if kind is None:
        return nn.Identity()
    if kind not in NORMS:
        raise ValueError(f"model.block.norm (and model.final_norm.kind) must be one of {NORMS} "
                         f"(MEGA's --norm-type), got {kind!r}")
    return {"layer": lambda: nn.LayerNorm(d_model), "scale": ScaleNorm, "batch": lambda: MaskedBatchNorm(d_model)}[kind]()


def apply_norm(norm: nn.Module, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    return norm(x, key_mask) if isinstance(norm, MaskedBatchNorm) else norm(x)


def function_arguments(function: str | None) -> dict[str, nn.Module]:
    """The keyword arguments that make the attention factory use ``function`` (none for None)."""
    if function is None:
        return {}
    if function not in FUNCTIONS:
        raise ValueError(f"model.block.attention_function must be null, 'softmax' or 'laplace', got {function!r}")
    return {"function": FUNCTIONS[function]()}


class MegaBlock(nn.Module):
    """``block(x (B, n, d_model), key_mask (B, n), aux_losses) -> (B, n, d_model)`` (adds no aux loss)."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        ffn_dim: int,
        dropout: float,
        attention: Callable[..., nn.Module],
        z_dim: int = 32,
        hidden_dim: int = 128,
        ndim: int = 16,
        chunk_size: int | None = None,
        norm: str = "layer",
        prenorm: bool = True,
        hidden_dropout: float = 0.0,
        attention_dropout: float = 0.0,
        ema_truncation: int | None = None,
        ema_shift: bool = False,
        ema_timescales: tuple[float, float] | None = None,
        attention_function: str | None = None,
    ):
        super().__init__()
        if num_heads != 1:
            raise ValueError(f"the MEGA block is single-head: set model.num_heads=1 (got {num_heads})")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"model.block.chunk_size must be null (no chunking) or >= 1, got {chunk_size}")
        if attention_dropout != 0:
            raise ValueError(f"model.block.attention_dropout={attention_dropout} is not implemented; MEGA's LRA "
                             "commands use 0 (facebookresearch/mega examples/mega/README.lra.md): set it to 0")
        self.d_model, self.z_dim, self.hidden_dim, self.chunk_size = d_model, z_dim, hidden_dim, chunk_size
        self.prenorm = prenorm
        self.norm = sequence_norm(d_model, norm)
        self.ema = BidirectionalEMA(d_model, ndim, truncation=ema_truncation, shift=ema_shift,
                                    timescales=ema_timescales)
        self.v_proj = nn.Linear(d_model, hidden_dim)
        self.mx_proj = nn.Linear(d_model, 2 * d_model + z_dim + hidden_dim)
        self.h_proj = nn.Linear(hidden_dim, d_model)
        self.qk_gamma = nn.Parameter(torch.randn(2, z_dim) * 0.02)
        self.qk_beta = nn.Parameter(torch.zeros(2, z_dim))
        try:
            self.attend = attention(num_heads=1, head_dim=z_dim, **function_arguments(attention_function))
        except TypeError as error:
            if attention_function is None:
                raise
            raise ValueError(
                f"model.block.attention_function={attention_function!r} needs a MEGA attention with a `function` "
                f"(attention=mega or attention=megacur): {error}") from error
        self.ffn_norm = sequence_norm(d_model, norm)
        self.ffn = nn.Sequential(nn.Linear(d_model, ffn_dim), nn.SiLU(), Dropout(hidden_dropout), nn.Linear(ffn_dim, d_model))
        self.dropout = Dropout(dropout)
        self.hidden_dropout = Dropout(hidden_dropout)
        for linear in (self.v_proj, self.mx_proj, self.h_proj, self.ffn[0], self.ffn[3]):
            nn.init.normal_(linear.weight, std=0.02)
            nn.init.zeros_(linear.bias)

    def chunked_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``q, k (B, n, z_dim)``, ``v (B, n, hidden_dim)`` -> ``(B, n, hidden_dim)``, per chunk of ``chunk_size``."""
        batch, n = key_mask.shape
        c = n if self.chunk_size is None else self.chunk_size
        pad = -n % c
        if pad:
            q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
            key_mask = F.pad(key_mask, (0, pad), value=False)
        chunks = (n + pad) // c
        q, k, v = (t.reshape(batch * chunks, 1, c, t.shape[-1]) for t in (q, k, v))  # (B·K, 1, c, ·)
        out = self.attend(q, k, v, key_mask.reshape(batch * chunks, c))
        return out.reshape(batch, chunks * c, -1)[:, :n]

    def mx_parts(self, mx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``mx W_mx + b`` split as ``(u, z, r, hx)`` (widths ``d_model, z_dim, hidden_dim, d_model``), one product per
        part with its rows of ``mx_proj``: the backward then adds four ``(B·n, d_model)`` input gradients instead of
        concatenating a ``(B·n, 2·d_model + z_dim + hidden_dim)`` one (docs/bench.md, "MEGA's gate projection by parts")."""
        cuts = list(itertools.accumulate([0, self.d_model, self.z_dim, self.hidden_dim, self.d_model]))
        weight, bias = self.mx_proj.weight, self.mx_proj.bias
        return tuple(F.linear(mx, weight[a:b], bias[a:b]) for a, b in zip(cuts, cuts[1:]))

    def gated_attention(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """The moving-average gated attention sub-layer (with its residual and norm)."""
        residual = x
        if self.prenorm:
            x = apply_norm(self.norm, x, key_mask)
        v = self.hidden_dropout(F.silu(self.v_proj(x)))
        mx = self.dropout(self.ema(x, key_mask))
        u, z, r, hx = self.mx_parts(mx)
        u, z, r = torch.sigmoid(u), F.silu(z), F.silu(r)
        q, k = (z * gamma + beta for gamma, beta in zip(self.qk_gamma, self.qk_beta))  # (B, n, z_dim) each
        attended = self.chunked_attention(q, k, v, key_mask)
        h = self.dropout(F.silu(hx + self.h_proj(attended * r)))
        y = residual + u * (h - residual)
        return y if self.prenorm else apply_norm(self.norm, y, key_mask)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor, aux_losses: dict[str, torch.Tensor]) -> torch.Tensor:
        y = self.gated_attention(x, key_mask)
        if self.prenorm:
            return y + self.dropout(self.ffn(apply_norm(self.ffn_norm, y, key_mask)))
        return apply_norm(self.ffn_norm, y + self.dropout(self.ffn(y)), key_mask)
