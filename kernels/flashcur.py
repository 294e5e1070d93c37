"""FlashCUR forward kernels (François et al. 2025, §5.2, Alg. 2): three fused Triton kernels.

Per sequence and head (``d`` = head_dim, ``n`` tokens, ``m`` selected rows/columns, ``s = 1/√d``):

* :func:`rv_forward` (kernel a): ``RV = softmax(s·Q_I Kᵀ + pad mask) V`` — flash attention (online
  softmax over key tiles) of the m selected query rows over all n keys; also returns the row
  log-sum-exp of ``R`` (base 2) for the backward. ``R`` (m×n) is never stored.
* :func:`u_forward` (kernel b): ``U = softmax(s·Q_I K_Jᵀ)`` (m×m), equal to ``C[I, :]`` (§4.1).
* :func:`out_forward` (kernel c): per query tile, ``Y = softmax(s·Q K_Jᵀ) W`` with ``W = U⁺ RV``
  (the m keys in chunks of BLOCK_M with an online softmax, like kernel a over its key tiles: the
  float32 product with ``W`` runs on FMA units, whose registers grow with its length), then rows
  ``I`` overwritten by ``RV``; also
  returns the row log-sum-exp of ``C`` (base 2). ``C`` (n×m) is never stored.

Layouts: ``q, k, v`` are ``(B, H, n, d)`` with a unit stride on ``d`` (any other strides); the small
tensors ``q_I, k_J`` (``(B, H, m, d)``), ``W, RV`` (``(B, H, m, d)`` float32) are contiguous.
Softmaxes run in base 2 (``exp2`` with ``s·log2 e``); all accumulation is float32. Inputs may be
float32, float16 or bfloat16. ``tl.dot`` operands are cast to float32 when the inputs are float32
or when running under ``TRITON_INTERPRET=1`` (the interpreter computes bf16 dots wrongly); every
``tl.dot`` operand is at least 16 in every dimension (:func:`block_sizes` asserts it). Launch
parameters (tiles, ``num_warps``, ``num_stages``, per GPU architecture and dtype) come from
:func:`kernels.launch.launch_config`, which ``tests/test_aot_compile.py`` compiles for sm_80 / sm_90
(shared memory within the limit, no register spills).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.launch import MIN_DOT, SUPPORTED_M, block_sizes, check_head_dim, device_capability, launch, launch_config  # noqa: F401

LOG2E = 1.4426950408889634


def interpreted() -> bool:
    """True when these kernels were defined under ``TRITON_INTERPRET=1`` (CPU interpreter)."""
    return not isinstance(_rv_fwd, triton.runtime.jit.JITFunction)


def config(kernel: str, n: int, m: int, d: int, like: torch.Tensor):
    """:func:`kernels.launch.launch_config` for inputs like ``like`` on its device (TF32 as torch allows)."""
    return launch_config(kernel, n, m, d, like.dtype, device_capability(like.device), tf32=torch.backends.cuda.matmul.allow_tf32)


@triton.jit
def _mm(a, b, F32_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """``a @ b`` with a float32 accumulator; operands in float32 when ``F32_DOT`` else in ``b``'s dtype."""
    if F32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)
    return tl.dot(a.to(b.dtype), b)


@triton.jit
def _mm32(a, b, PRECISION: tl.constexpr):
    """``a @ b`` in float32 (for products with the float32 ``W``, ``RV`` and their gradients)."""
    return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)


@triton.jit
def _masked_softmax_tile(scores, valid):
    """Base-2 softmax of a ``(rows, M)`` tile over its columns ``valid`` (others 0) and its log-sum-exp.

    A row without any valid column is all 0 (never NaN), like :func:`attention.scores.masked_softmax`.
    """
    row_max = tl.max(tl.where(valid[None, :], scores, -1.0e30), 1)
    p = tl.where(valid[None, :], tl.exp2(scores - row_max[:, None]), 0.0)
    l = tl.sum(p, 1)
    safe_l = tl.where(l > 0, l, 1.0)
    return p / safe_l[:, None], row_max + tl.log2(safe_l)


@triton.jit
def _rv_fwd(
    QI, K, V, MASK, RV, LSE,
    stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_mb,
    H, N, D, M, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: BLOCK_M selected query rows of one (batch, head); online softmax over key tiles."""
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q = tl.load(QI + pid_bh * M * D + offs_m[:, None] * D + offs_d[None, :], mask=d_ok[None, :], other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        tile_ok = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=tile_ok, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=tile_ok, other=0.0)
        real = tl.load(MASK + b * stride_mb + offs_n, mask=n_ok, other=0) != 0
        scores = _mm(q, tl.trans(k), F32_DOT, PRECISION) * qk_scale
        scores = tl.where(real[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _mm(p, v, F32_DOT, PRECISION)
        m_i = m_new
    safe_l = tl.where(l_i > 0, l_i, 1.0)
    out = acc / safe_l[:, None]
    tl.store(RV + pid_bh * M * D + offs_m[:, None] * D + offs_d[None, :], out, mask=d_ok[None, :])
    tl.store(LSE + pid_bh * M + offs_m, m_i + tl.log2(safe_l))


@triton.jit
def _u_fwd(
    QI, KJ, VALIDK, U, D, qk_scale,
    M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: BLOCK_M rows of ``U = softmax(s·Q_I K_Jᵀ)`` over all m selected keys."""
    pid_bh = tl.program_id(0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_j = tl.arange(0, M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < D
    q = tl.load(QI + pid_bh * M * D + offs_m[:, None] * D + offs_d[None, :], mask=d_ok, other=0.0)
    kj = tl.load(KJ + pid_bh * M * D + offs_j[:, None] * D + offs_d[None, :], mask=d_ok, other=0.0)
    valid = tl.load(VALIDK + pid_bh * M + offs_j) != 0
    p, _ = _masked_softmax_tile(_mm(q, tl.trans(kj), F32_DOT, PRECISION) * qk_scale, valid)
    tl.store(U + pid_bh * M * M + offs_m[:, None] * M + offs_j[None, :], p)


@triton.jit
def _out_fwd(
    Q, KJ, VALIDK, W, RV, SLOT, OUT, LSE,
    stride_qb, stride_qh, stride_qn, stride_ob, stride_oh, stride_on,
    H, N, D, qk_scale,
    M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: a tile of BLOCK_N query rows; ``softmax(s·Q K_Jᵀ) W``, selected rows take ``RV``.

    The m keys are visited in chunks of BLOCK_M with an online softmax (one chunk when BLOCK_M = M):
    float32 dots run on FMA units, whose registers grow with the dot's K, so fp32 launches chunk m.
    """
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    n_ok = offs_n < N
    d_ok = offs_d < D
    tile_ok = n_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_n[:, None] * stride_qn + offs_d[None, :], mask=tile_ok, other=0.0)
    m_i = tl.full([BLOCK_N], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_N], tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for start in range(0, M, BLOCK_M):
        offs_j = start + tl.arange(0, BLOCK_M)
        small = pid_bh * M * D + offs_j[:, None] * D + offs_d[None, :]
        kj = tl.load(KJ + small, mask=d_ok[None, :], other=0.0)
        w = tl.load(W + small, mask=d_ok[None, :], other=0.0)
        valid = tl.load(VALIDK + pid_bh * M + offs_j) != 0
        scores = tl.where(valid[None, :], _mm(q, tl.trans(kj), F32_DOT, PRECISION) * qk_scale, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.where(valid[None, :], tl.exp2(scores - m_new[:, None]), 0.0)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _mm32(p, w, PRECISION)
        m_i = m_new
    safe_l = tl.where(l_i > 0, l_i, 1.0)  # a row without any valid key is all 0 (never NaN)
    y = acc / safe_l[:, None]
    slot = tl.load(SLOT + pid_bh * N + offs_n, mask=n_ok, other=-1)
    chosen = slot >= 0
    rv = tl.load(RV + pid_bh * M * D + slot[:, None] * D + offs_d[None, :], mask=chosen[:, None] & d_ok[None, :], other=0.0)
    y = tl.where(chosen[:, None], rv, y)
    out_ptrs = OUT + b * stride_ob + h * stride_oh + offs_n[:, None] * stride_on + offs_d[None, :]
    tl.store(out_ptrs, y.to(OUT.dtype.element_ty), mask=tile_ok)
    tl.store(LSE + pid_bh * N + offs_n, m_i + tl.log2(safe_l), mask=n_ok)


def _scale(d: int) -> float:
    return LOG2E / math.sqrt(d)


def rv_forward(q_sel: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor):
    """Kernel (a). ``q_sel`` ``(B,H,m,d)``, ``k, v`` ``(B,H,n,d)``, ``key_mask`` bool ``(B,n)``.

    Returns ``RV`` float32 ``(B,H,m,d)`` and the base-2 log-sum-exp of ``R``'s rows, float32 ``(B,H,m)``.
    """
    B, H, m, d = q_sel.shape
    n = k.shape[2]
    cfg = config("_rv_fwd", n, m, d, q_sel)
    rv = torch.empty(B, H, m, d, device=q_sel.device, dtype=torch.float32)
    lse = torch.empty(B, H, m, device=q_sel.device, dtype=torch.float32)
    mask = key_mask.to(torch.uint8)
    launch(
        "_rv_fwd", (B * H, m // cfg.constexprs["BLOCK_M"]), cfg,
        q_sel, k, v, mask, rv, lse,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), mask.stride(0),
        H, n, d, m, _scale(d),
    )
    return rv, lse


def u_forward(q_sel: torch.Tensor, k_sel: torch.Tensor, valid_k: torch.Tensor) -> torch.Tensor:
    """Kernel (b). ``q_sel, k_sel`` ``(B,H,m,d)``, ``valid_k`` bool ``(B,H,m)`` (usable key slots)
    -> ``U = softmax(s·Q_I K_Jᵀ)`` over the valid slots, float32 ``(B,H,m,m)``."""
    B, H, m, d = q_sel.shape
    cfg = config("_u_fwd", m, m, d, q_sel)
    u = torch.empty(B, H, m, m, device=q_sel.device, dtype=torch.float32)
    launch("_u_fwd", (B * H, m // cfg.constexprs["BLOCK_M"]), cfg, q_sel, k_sel, valid_k.to(torch.uint8), u, d, _scale(d))
    return u


def out_forward(q, k_sel, valid_k, w, rv, slot):
    """Kernel (c). ``q`` ``(B,H,n,d)``, ``k_sel`` ``(B,H,m,d)``, ``valid_k`` bool ``(B,H,m)`` (the
    columns of ``C`` to keep), ``w, rv`` float32 ``(B,H,m,d)``,
    ``slot`` int32 ``(B,H,n)`` (position of each row in ``I``, −1 if not selected).

    Returns ``Y`` ``(B,H,n,d)`` in ``q``'s dtype and the base-2 log-sum-exp of ``C``'s rows ``(B,H,n)``.
    """
    B, H, n, d = q.shape
    m = k_sel.shape[2]
    cfg = config("_out_fwd", n, m, d, q)
    out = torch.empty(B, H, n, d, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, H, n, device=q.device, dtype=torch.float32)
    launch(
        "_out_fwd", (B * H, triton.cdiv(n, cfg.constexprs["BLOCK_N"])), cfg,
        q, k_sel, valid_k.to(torch.uint8), w, rv, slot, out, lse,
        q.stride(0), q.stride(1), q.stride(2), out.stride(0), out.stride(1), out.stride(2),
        H, n, d, _scale(d),
    )
    return out, lse
