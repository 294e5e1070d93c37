"""Landmark attention on the CPU (float32): softmax or L1-score attention where one side is a few landmarks, the
bindings of ``cpu.cpp`` and ``cpu_backward.cpp`` (with the shared ``kernels/common/landmark_attention.h``), the
autograd node :class:`LandmarkAttention` over them and :func:`attend`, the op the score functions call
(:meth:`attention.scores.SoftmaxScore.attend`, ``L1Score.attend``). The plain PyTorch reference the tests compare
against: :mod:`kernels.landmark_attention.naive`.

* *few keys* (:func:`few_keys_forward`, ≤ 128 keys: CUR's and Nyström's ``C W``): a query row's logits stay in
  registers; *few queries* (:func:`few_queries_forward`, ≤ 128 queries: ``R V``, Nyström's ``k₃ V``): logits are
  vectors over the queries, the softmax over keys runs online over blocks of 32 keys (flash attention's running
  maxima and sums), and blocks whose keys are all padding are skipped. Both compute
  ``softmax(scale · Q Kᵀ + log M) V`` per (batch, head) with a key mask ``M``, or with ``l1=True``
  ``softmax(scale · ‖q_i − k_j‖₁ + log M) V`` (EcoTransformer); neither writes the ``n × m`` weights. A row with
  no real key gives 0 (SDPA's convention).
* Backward (:func:`few_keys_backward`, :func:`few_queries_backward`): flash attention's backward from the forward's
  ``Y`` and ``lse_i = log Σ_j exp(s_ij)``, ``dS = P ⊙ (dY Vᵀ − rowsum(dY ⊙ Y))``, ``dQ = scale · dS K``,
  ``dK = scale · dSᵀ Q``, ``dV = Pᵀ dY`` (L1: ``dS`` contracted with ``sign(q_i − k_j)``), the weights recomputed
  a tile at a time; every gradient is written once in the layout of its operand.

Backend, chosen once by :func:`kernel_for` (on :func:`kernel_takes`, which the selection and pseudo-inverse kernels
share): float32 CPU tensors with contiguous rows, outside
``torch.compile`` (a ctypes call would break the graph) and outside dispatch modes (``FlopCounterMode`` counts the
PyTorch forms, the same products), a head size that is a multiple of the vector width and a mask that depends on
the key only; :func:`attend` runs SDPA otherwise. Without a compiler they warn once (:mod:`kernels.common.build`).
:class:`LandmarkAttention` backpropagates by the backward kernels, or for dot products by ATen's flash-attention
backward where they cannot run (no compiler, a dispatch mode). Proxyformer keeps SDPA (docs/bench.md, "Landmark
kernels on CPU").
"""

from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from kernels.common.build import I64, PTR, load_or_warn, source, vector_bytes
from kernels.common.rows import token_major

MAX_KEYS = 128

_TAIL = [ctypes.c_float, ctypes.c_int, ctypes.c_int]  # the attention kernels' last arguments: scale, l1, threads


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """The forward kernels (``cpu.cpp``), or None (with a warning) without a compiler."""
    return load_or_warn(source("landmark_attention/cpu.cpp"), "landmark attention runs without its CPU kernels",
                        "landmarks_vector_bytes", {
                            "landmarks_few_keys_attend_f32": [PTR] * 10 + [I64] * 6 + _TAIL,
                            "landmarks_few_queries_attend_f32": [PTR] * 6 + [I64] + [PTR] * 4 + [I64] * 6 + _TAIL,
                        }, ctypes.c_int)


@functools.lru_cache(maxsize=None)
def backward_library() -> ctypes.CDLL | None:
    """The backward kernels (``cpu_backward.cpp``), or None (with a warning: ATen's flash backward runs
    instead)."""
    return load_or_warn(source("landmark_attention/cpu_backward.cpp"),
                        "landmark attention's backward runs ATen's flash backward", "landmarks_backward_vector_bytes", {
                            "landmarks_few_keys_backward_f32": [PTR] * 16 + [I64] * 7 + _TAIL,
                            "landmarks_few_queries_backward_f32": [PTR] * 11 + [I64] + [PTR] * 5 + [I64] * 6 + _TAIL,
                        }, ctypes.c_int)


def kernel_takes(*tensors: torch.Tensor) -> bool:
    """Float32 CPU tensors with contiguous rows, outside ``torch.compile`` and outside a dispatch mode (which
    cannot see a ctypes call: ``FlopCounterMode`` counts the PyTorch forms), and the library built."""
    return (not torch.compiler.is_compiling() and not is_in_torch_dispatch_mode()
            and all(x.device.type == "cpu" and x.dtype == torch.float32 and x.stride(-1) == 1 for x in tensors)
            and library() is not None)


def strides_of(x: torch.Tensor) -> ctypes.Array:
    """The first three strides of ``x`` (batch, head, row) as the kernels' ``int64_t[3]``."""
    return (ctypes.c_int64 * 3)(*x.stride()[:3])


def vector_floats() -> int:
    """Floats per vector of the instruction set the kernels are compiled for: ``d`` must be a multiple of it."""
    return vector_bytes() // 4


def padded(m: int) -> int:
    """The kernels' padded count for ``m`` keys (few keys) or queries (few queries): :func:`vector_floats` times
    the next power of two."""
    width = vector_floats()
    return width * (1 << max(0, (m - 1) // width).bit_length())


def kernel_for(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None) -> str | None:
    """``"few_keys"`` (≤ 128 keys), ``"few_queries"`` (≤ 128 queries) or None (SDPA) for these ``(B, H, ·, d)``
    operands (see the module docstring)."""
    if not (kernel_takes(q, k, v) and q.shape[-1] == k.shape[-1] == v.shape[-1]  # first: nothing else under compile
            and q.shape[-1] % vector_floats() == 0 and (key_mask is None or key_mask.shape[-2] == 1)):
        return None
    if k.shape[-2] <= MAX_KEYS:
        return "few_keys"
    return "few_queries" if q.shape[-2] <= MAX_KEYS else None


def key_bias(key_mask: torch.Tensor | None, batch: int, heads: int, n: int, like: torch.Tensor) -> torch.Tensor:
    """The additive mask (0 or −inf) ``(B, 1 or H, 1, n)`` of a bool ``key_mask`` broadcasting to ``(B, H, 1, n)``."""
    if key_mask is None:
        return like.new_zeros(batch, 1, 1, n)
    mask = key_mask.expand(batch, key_mask.shape[1], 1, n)
    return like.new_zeros(mask.shape).masked_fill_(~mask, -torch.inf)


def _transposed(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x`` ``(B, H, r, d)`` transposed to ``(B, H, d, width)``, zero past its ``r`` columns (the kernels' few side)."""
    out = x.new_zeros(*x.shape[:2], x.shape[-1], width)
    out[..., : x.shape[-2]] = x.transpose(-1, -2)
    return out


def _padded_bias(bias: torch.Tensor, batch: int, heads: int, m: int, width: int) -> torch.Tensor:
    """``bias`` ``(B, 1 or H, 1, m)`` of the few keys as ``(B, H, width)``, −inf past the ``m`` keys."""
    out = bias.new_full((batch, heads, width), -torch.inf)
    out[..., :m] = bias.expand(batch, heads, 1, m)[:, :, 0]
    return out


def few_keys_forward(q, k, v, bias, scale: float, l1: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Y, row max, row sum)`` of ``q`` ``(B, H, n, d)`` against ``k, v`` ``(B, H, m, d)``, m ≤ 128, and ``bias``
    ``(B, 1 or H, 1, m)``: ``Y`` in SDPA's ``(B, n, H, d)`` memory, ``lse = max + log(sum)``; L1 scores if ``l1``."""
    batch, heads, n, d = q.shape
    m = k.shape[-2]
    mp = padded(m)
    kt, padded_bias = _transposed(k, mp), _padded_bias(bias, batch, heads, m, mp)
    y = token_major(q)
    row_max, row_sum = q.new_empty(2, batch, heads, n)
    status = library().landmarks_few_keys_attend_f32(
        q.data_ptr(), strides_of(q), kt.data_ptr(), padded_bias.data_ptr(), v.data_ptr(), strides_of(v), y.data_ptr(),
        strides_of(y), row_max.data_ptr(), row_sum.data_ptr(), batch, heads, n, m, mp, d, scale, l1,
        torch.get_num_threads())
    if status:
        raise ValueError(f"kernels.landmark_attention: m={m} (padded {mp}) or d={d} is not supported by the few-keys kernel")
    return y, row_max, row_sum


def few_queries_forward(q, k, v, bias, scale: float, l1: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Y, row max, row sum)`` of ``q`` ``(B, H, m, d)``, m ≤ 128, against ``k, v`` ``(B, H, n, d)`` and ``bias``
    ``(B, 1 or H, 1, n)``, as :func:`few_keys_forward`."""
    batch, heads, m, d = q.shape
    n = k.shape[-2]
    mq = padded(m)
    qt = _transposed(q, mq)
    bias = bias.contiguous()
    y = token_major(q)
    row_max, row_sum = q.new_empty(2, batch, heads, m)
    status = library().landmarks_few_queries_attend_f32(
        qt.data_ptr(), k.data_ptr(), strides_of(k), v.data_ptr(), strides_of(v), bias.data_ptr(), bias.shape[1],
        y.data_ptr(), strides_of(y), row_max.data_ptr(), row_sum.data_ptr(), batch, heads, m, mq, n, d, scale, l1,
        torch.get_num_threads())
    if status:
        raise ValueError(f"kernels.landmark_attention: m={m} (padded {mq}) or d={d} is not supported by the few-queries kernel")
    return y, row_max, row_sum


def few_keys_backward(grad, q, k, v, bias, y, lse, scale: float, l1: bool = False,
                      zero_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dQ, dK, dV)`` of :func:`few_keys_forward` from the gradient ``grad`` of ``y`` and its ``lse``
    ``(B, H, n)`` (``cpu_backward.cpp`` has the equations); ``dQ`` in ``q``'s memory layout (the
    model's ``(B, n, H, d)``: autograd then passes it to the projection without a copy), ``dK``, ``dV``
    contiguous. ``zero_rows`` long ``(B, H, r)``: rows of ``y`` the caller overwrote after the forward, whose
    ``grad`` rows count as 0 (their ``dQ`` rows are 0), without a copy of ``grad``."""
    batch, heads, n, d = q.shape
    m = k.shape[-2]
    mp = padded(m)
    kt, vt, k_rows = _transposed(k, mp), _transposed(v, mp), k.contiguous()  # held: ctypes keeps no reference
    padded_bias = _padded_bias(bias, batch, heads, m, mp)
    zero_rows = q.new_empty(batch, heads, 0, dtype=torch.int64) if zero_rows is None else zero_rows.contiguous()
    dq, (dk, dv) = torch.empty_like(q), q.new_empty(2, batch, heads, m, d)  # dQ in q's memory layout
    status = backward_library().landmarks_few_keys_backward_f32(
        q.data_ptr(), strides_of(q), grad.data_ptr(), strides_of(grad), y.data_ptr(), strides_of(y), lse.data_ptr(),
        kt.data_ptr(), vt.data_ptr(), k_rows.data_ptr(), padded_bias.data_ptr(), dq.data_ptr(), strides_of(dq),
        dk.data_ptr(), dv.data_ptr(), zero_rows.data_ptr(), zero_rows.shape[-1], batch, heads, n, m, mp, d, scale, l1,
        torch.get_num_threads())
    if status:
        raise ValueError(f"kernels.landmark_attention: m={m} (padded {mp}), d={d} or a zero row outside [0, {n}) is not "
                         "supported by the few-keys backward")
    return dq, dk, dv


def few_queries_backward(grad, q, k, v, bias, y, lse, scale: float,
                         l1: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dQ, dK, dV)`` of :func:`few_queries_forward`, as :func:`few_keys_backward`; here ``dK`` and ``dV`` (the
    sequence side) take the layouts of ``k`` and ``v``, and ``dQ`` is contiguous."""
    batch, heads, m, d = q.shape
    n = k.shape[-2]
    mq = padded(m)
    neg_lse, delta = q.new_full((batch, heads, mq), -torch.inf), q.new_zeros(batch, heads, mq)
    neg_lse[..., :m] = -lse
    delta[..., :m] = (grad * y).sum(-1)
    bias, qt, dyt = bias.contiguous(), _transposed(q, mq), _transposed(grad, mq)  # held: ctypes keeps no reference
    q_rows, grad_rows = q.contiguous(), grad.contiguous()
    dq, dk, dv = q.new_empty(q.shape), torch.empty_like(k), torch.empty_like(v)  # dK, dV in k's, v's layouts
    status = backward_library().landmarks_few_queries_backward_f32(
        qt.data_ptr(), dyt.data_ptr(), q_rows.data_ptr(), grad_rows.data_ptr(), neg_lse.data_ptr(),
        delta.data_ptr(), k.data_ptr(), strides_of(k),
        v.data_ptr(), strides_of(v), bias.data_ptr(), bias.shape[1], dq.data_ptr(), dk.data_ptr(), strides_of(dk),
        dv.data_ptr(), strides_of(dv), batch, heads, m, mq, n, d, scale, l1, torch.get_num_threads())
    if status:
        raise ValueError(f"kernels.landmark_attention: m={m} (padded {mq}) or d={d} is not supported by the few-queries backward")
    return dq, dk, dv


FORWARDS = {"few_keys": few_keys_forward, "few_queries": few_queries_forward}
BACKWARDS = {"few_keys": few_keys_backward, "few_queries": few_queries_backward}



class LandmarkAttention(torch.autograd.Function):
    """``softmax(scale · Q Kᵀ + bias) V`` (``l1``: ``softmax(scale · ‖q_i − k_j‖₁ + bias) V``) by the kernel ``kind``;
    backward by its backward kernel, or for dot products ATen's flash-attention backward where that does not apply
    (no compiler, a dispatch mode)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, scale: float, kind: str, l1: bool):
        y, row_max, row_sum = FORWARDS[kind](q, k, v, bias, scale, l1)
        lse = row_sum.log_().add_(row_max) if any(ctx.needs_input_grad[:3]) else None
        ctx.save_for_backward(q, k, v, bias, y, lse)
        ctx.scale, ctx.kind, ctx.l1 = scale, kind, l1
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        q, k, v, bias, y, lse = ctx.saved_tensors
        grad = grad if grad.stride(-1) == 1 else grad.contiguous()  # e.g. the expanded gradient of a sum
        if kernel_takes(grad) and backward_library() is not None:
            grads = BACKWARDS[ctx.kind](grad, q, k, v, bias, y, lse, ctx.scale, ctx.l1)
        elif ctx.l1:
            raise RuntimeError("the backward of L1 landmark attention runs only by its CPU kernel, which cannot run "
                               "inside torch.compile or a dispatch mode: run the forward there too (it then takes "
                               "the PyTorch form of attention.scores.L1Score)")
        else:
            grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad, q, k, v, y, lse, 0.0, False, attn_mask=bias, scale=ctx.scale)
        return *grads, None, None, None, None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
           l1_scale: float | None = None, kernel: bool = True) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)`` (default scale ``1/√d``), by a kernel where
    :func:`kernel_for` names one; ``key_mask`` bool broadcasting to ``(B, H, 1, n_keys)`` or None.

    With ``l1_scale`` ``c``: ``softmax(c · ‖q_i − k_j‖₁ + log M) V`` (L1 scores, ``c = −λ/√d``), by a kernel only
    (the caller checks :func:`kernel_for` and :func:`backward_library`; :class:`attention.scores.L1Score` does)."""
    kind = kernel_for(q, k, v, key_mask) if kernel else None  # kernel=False: SDPA (attention.impl=pytorch)
    if kind is None and l1_scale is not None:
        raise ValueError("kernels.landmark_attention.cpu.attend with L1 scores needs a kernel (kernel_for names none for "
                         "these operands)")
    if kind is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
    batch, heads = torch.broadcast_shapes(q.shape[:2], k.shape[:2], v.shape[:2])
    q, k, v = (x.expand(batch, heads, *x.shape[2:]) for x in (q, k, v))
    bias = key_bias(key_mask, batch, heads, k.shape[-2], q)
    scale = q.shape[-1] ** -0.5 if l1_scale is None else l1_scale
    return LandmarkAttention.apply(q, k, v, bias, scale, kind, l1_scale is not None)
