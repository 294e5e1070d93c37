"""L1-distance attention (EcoTransformer, Gao & Xu 2025, eq. 1; docs/design.md §2 "L1 attention").

``Y = softmax(−λ ‖q_i − k_j‖₁ / √d + pad mask) V`` per head, ``q, k, v`` ``(B, H, n, d)``: keys close to
the query in L1 distance get the largest weights. λ = 1 by default (the paper's "robust" setting is 3).
Cost O(n² d) time (n² d absolute differences, as many as the multiply-adds of ``QKᵀ``). Backward,
with ``S_ij = −λ‖q_i − k_j‖₁/√d`` and ``dS`` the softmax backward of ``dP = dY Vᵀ``::

    dq_i = (−λ/√d) Σ_j dS_ij sign(q_i − k_j),    dk_j = −(−λ/√d) Σ_i dS_ij sign(q_i − k_j),    dV = Pᵀ dY

Decisions: computed in float32 with autocast disabled (float64 stays float64), output cast back to
the input dtype. On CPU, :class:`kernels.l1.cpu.L1AttentionFunction`: compiled kernels for the
distance and the sign contraction, flash-style query chunks, memory O(B·H·chunk·n) beyond the
inputs (never the n×n matrix), attention dropout inside the function (``attention.impl=cpu``, ``auto``'s choice on
CPU tensors; :mod:`attention.impl`). On CUDA (``triton``), the fused Triton
kernels of :mod:`kernels.l1` (online softmax, nothing n×n stored) whenever attention dropout is
off (evaluation, or ``attention.dropout=0``); they have no dropout, so training with dropout on CUDA
takes the PyTorch path of :class:`attention.scores.L1Score` (``cdist`` forward, query-chunked backward, the
n×n weights materialised), as other devices do, and says so once (:func:`warn_unfused_training`: in eager
code at the first such call; under ``torch.compile``, whose Dynamo cannot trace ``warnings.warn``, before
compiling, from :func:`lra.module.compile_in_place` through :meth:`L1Attention.before_compile`). No parameters
of its own, so a softmax checkpoint loads with ``strict=True``.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from attention import impl
from attention.config_checks import check_dropout
from attention.scores import L1Score
from kernels.l1.cpu import L1AttentionFunction, uses_kernel
from kernels.l1.ops import flash_l1_attention

UNFUSED_TRAINING = ("L1 attention: FlashL1 has no attention dropout, so training on CUDA with attention.dropout > 0 "
                    "materialises the n×n weights; set attention.dropout=0 to train with the fused kernel")


def warn_unfused_training() -> None:
    """Warn (once per process: the default filter) that CUDA training with attention dropout takes the materialised
    path; nothing while ``torch.compile`` traces: Dynamo cannot trace ``warnings.warn`` (``fullgraph=True`` fails on
    it), and a compiled run was warned before compiling (:meth:`L1Attention.before_compile`)."""
    if not torch.compiler.is_compiling():
        warnings.warn(UNFUSED_TRAINING, stacklevel=3)


class L1Attention(nn.Module):
    """Exact attention with the L1 score; ``dropout`` on the weights during training (as softmax)."""

    impl_family = "l1"

    def __init__(self, num_heads: int, head_dim: int, lam: float = 1.0, dropout: float = 0.0):
        super().__init__()
        check_dropout(dropout)
        self.impl = "auto"  # attention.impl, set by attention.impl.configure
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.score = L1Score(lam)
        self.dropout = nn.Dropout(dropout)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        forms = impl.forms_for(self, q)  # attention.impl (family l1): cpu, triton or pytorch
        # the kernels take values as wide as the queries; the diagnostics' V = I (n wide, from
        # ``models.blocks.MultiHeadAttention.attention_matrix``) runs the PyTorch form, as compiled code does on CPU
        kernel_shaped = v.shape[-1] == q.shape[-1]
        if forms.attention == "cpu" and uses_kernel(q) and kernel_shaped:
            p = self.dropout.p if self.training else 0.0
            seed = int(torch.randint(1 << 62, ())) if p > 0 else 0  # from the global RNG: seeded runs repeat
            dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
            with torch.autocast(device_type="cpu", enabled=False):
                out = L1AttentionFunction.apply(q.to(dtype), k.to(dtype), v.to(dtype), key_mask, self.score.lam, p,
                                                seed)
            return out.to(v.dtype)
        dropout_on = self.training and self.dropout.p > 0
        if forms.attention == "triton" and not dropout_on and kernel_shaped:
            return flash_l1_attention(q, k, v, key_mask, self.score.lam)
        if forms.attention == "triton" and kernel_shaped:
            warn_unfused_training()
        return self.materialised(q, k, v, key_mask)

    def before_compile(self, device: torch.device) -> None:
        """Called by :func:`lra.module.compile_in_place` before compiling for ``device``: the warning of
        :func:`warn_unfused_training`, which compiled code cannot give, when training there would take the
        materialised path (CUDA, attention dropout on)."""
        if device.type == "cuda" and self.dropout.p > 0:
            warnings.warn(UNFUSED_TRAINING, stacklevel=2)

    def materialised(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """The PyTorch path: the ``(B, H, n, n)`` float32 weights (dropout on them in training) times ``V``.
        CUDA runs it with attention dropout on; ``lra.bench.gpu_check`` checks FlashL1 against it."""
        weights = self.score(q, k, key_mask[:, None, None, :])
        return (self.dropout(weights) @ v.to(weights.dtype)).to(v.dtype)
