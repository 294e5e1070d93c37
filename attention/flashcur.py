"""FlashCUR attention (FlashCURformer; François et al., Machine Learning 2025, §5.2, Alg. 2; docs/design.md §2 "FlashCUR").

The CUR approximation of :mod:`attention.cur` (softmax score), computed by the fused Triton kernels
of :mod:`kernels.cur` (forward and backward, as the custom ops of :mod:`kernels.cur.ops`)::

    RV = softmax(s·Q_I Kᵀ + pad mask) V     kernel (a), online softmax over key tiles    (m × d)
    U  = softmax(s·Q_I K_Jᵀ)                kernel (b)                                   (m × m)
    W  = U⁺ RV                              PyTorch, float32 (``attention.pinv``)         (m × d)
    Y  = softmax(s·Q K_Jᵀ) W, Y[I] = RV     kernel (c), one query tile per program       (n × d)

``s = 1/√d``. ``C`` (n×m) and ``R`` (m×n) are never stored: the forward keeps only their row
log-sum-exps (n + m floats per head) and the backward recomputes them tile by tile. Between the kernels a
handful of batched operators (selection, the rows ``Q_I`` and ``K_J``, ``U``'s identity rows on invalid slots,
``W``, the merge of the split kernels' partials), no host synchronisation: 36 kernel launches for a layer's forward
and backward at n 4096, B 8, H 2, m 64 with a fused pseudo-inverse (``python -m lra.bench launches``; where each
runs: ``python -m lra.bench plan``).

Parameters and defaults are CURformer's (``configs/attention/curformer.yaml``; selection by
:func:`attention.selection.select_indices`, same rules and decisions, including ``n_real < m``).
Decisions: the kernels implement the softmax score only (CUR's ``score`` option is absent; use
``attention=curformer`` for other scores). m = min(num_landmarks, n) is padded up to the next of
16/32/64/128 with inert slots (masked columns of C, identity block of U, never written to Y), so
any m ≤ 128 runs. ``W`` and ``RV`` are float32; q/k/v may be float32, float16 or bfloat16
(float32 accumulation; with bf16 / fp16 every kernel product runs on tensor cores in that dtype); the output and
the n × d gradients have q's dtype. The kernels whose programs walk all n tokens split n so a GPU gets at least
two waves of programs (per-split partials merged exactly: :mod:`kernels.cur.launch`). Needs CUDA tensors, or the Triton interpreter
(``TRITON_INTERPRET=1`` set before :mod:`kernels.cur` is imported; on CPU, for tests at tiny shapes).
Cost as CUR: O(nmd + m²d + m³) time; O(nd + md + m²) memory (no O(nm) term).

Each kernel (pair) is a ``torch.library`` custom op (``lra_flashcur::*``, :mod:`kernels.cur.ops`) with a fake
implementation (shapes and dtypes: the ``meta`` device, ``torch.compile``'s tracing), its autograd formula and its FLOP
formula (for ``torch.utils.flop_counter``, which cannot see inside the kernels: :data:`kernels.cur.ops.PRODUCTS`)
registered on it. Here: the variant (:class:`FlashCURAttention`), the composition of the ops
(:func:`flashcur_attention`) and the device checks. The plain reference: :mod:`kernels.cur.naive`.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from attention import impl, paths
from attention.cur import CURAttention, _with_rows
from attention.pinv import iterative_pinv
from kernels.common.precision import autocast_off
from kernels.common.launch import device_capability, interpreted
from kernels.cur import launch as kernel_launch
from kernels.cur import ops


@functools.lru_cache(maxsize=None)
def _slot_numbers(m: int, device: torch.device) -> torch.Tensor:
    """``0, 1, …, m − 1`` as int32 on ``device``, made once (a constant, not a launch per call)."""
    return torch.arange(m, dtype=torch.int32, device=device)


def _padded_size(m: int) -> int:
    """The smallest kernel size in ``kernels.cur.launch.SUPPORTED_M`` that holds ``m`` slots."""
    size = kernel_launch.padded_m(m)
    if size is not None:
        return size
    raise ValueError(
        f"FlashCUR supports at most {kernel_launch.SUPPORTED_M[-1]} selected rows (attention.num_landmarks), got {m}; "
        "lower attention.num_landmarks or use attention=curformer"
    )


def check_device(q: torch.Tensor) -> None:
    """FlashCUR runs its kernels on CUDA tensors, or on CPU tensors under the Triton interpreter; on ``meta``
    tensors (shapes only) the custom ops' fake implementations run instead."""
    if q.is_cuda or q.device.type == "meta" or (q.device.type == "cpu" and interpreted()):
        return
    hint = (
        "kernels.cur was imported without TRITON_INTERPRET=1: set it in the environment before "
        "starting Python"
        if q.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
        else "run on a CUDA GPU (trainer=gpu), set TRITON_INTERPRET=1 before starting Python to run "
        "the kernels in Triton's (slow) CPU interpreter, or use attention=curformer (same method in PyTorch)"
    )
    raise RuntimeError(f"attention=flashcur needs CUDA tensors or the Triton interpreter; got {q.device} tensors: {hint}")


def flashcur_attention(q, k, v, key_mask, index_q, index_k, pinv_iters=6, overwrite_rows=True, pinv_init="per_head",
                       pinv_form=None):
    """CUR attention through the fused kernels -> ``(B, H, n, d)`` in ``q``'s dtype.

    Same contract as :func:`attention.cur.cur_attention` with the softmax score: ``q, k, v``
    ``(B, H, n, d)``, ``key_mask`` bool ``(B, n)``, ``index_q, index_k`` long ``(B, H, m)``; ``pinv_form``: the
    pseudo-inverse's form (:func:`attention.pinv.iterative_pinv`; None: its default for the device).
    """
    if not q.shape == k.shape == v.shape:
        shapes = ", ".join(str(tuple(x.shape)) for x in (q, k, v))
        raise ValueError(f"FlashCUR's kernels take q, k, v of one shape (B, H, n, d), got {shapes}; for values of "
                         "another width (such as a diagnostic's V = I) use attention=curformer, the same method and "
                         "parameters in PyTorch")
    check_device(q)
    if not q.dtype == k.dtype == v.dtype or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"FlashCUR takes q, k, v of one dtype among float32/float16/bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    batch, heads, n, _ = q.shape
    m = index_q.shape[2]
    size = _padded_size(m)
    positions_mask = key_mask[:, None, :].expand(batch, heads, n)
    same = index_k is index_q
    if size > m:  # inert slots up to the kernels' size: never valid, never written to Y
        index_q = F.pad(index_q, (0, size - m))
        index_k = index_q if same else F.pad(index_k, (0, size - m))
    valid_q = positions_mask.gather(2, index_q)  # (B, H, M)
    valid_k = valid_q if same else positions_mask.gather(2, index_k)
    if size > m:
        real_slot = _slot_numbers(size, q.device) < m
        valid_q = valid_q & real_slot
        valid_k = valid_q if same else valid_k & real_slot
    q, q_sel = _with_rows(q, index_q)  # (B, H, n, d), (B, H, M, d)
    k, k_sel = _with_rows(k, index_k)
    rv, _ = ops.rv_forward(q_sel, k, v, key_mask)  # (B, H, M, d) float32
    with autocast_off(q.device.type):
        eye = paths.identity(size, torch.float32, q.device)
        u = torch.where(valid_q[..., None], ops.u_forward(q_sel, k_sel, valid_k), eye)  # identity rows on invalid slots
        # U⁺, (B, H, M, M): the fused kernels keep one iterate a step for their backward, the PyTorch form recomputes
        pinv = iterative_pinv(u, pinv_iters, pinv_init, recompute=True, form=pinv_form)
        w, rv = paths.product_and_rows(pinv, rv)  # U⁺ RV, (B, H, M, d)
    slot = torch.full((batch, heads, n), -1, dtype=torch.int32, device=q.device)
    if overwrite_rows:
        slot.scatter_(2, index_q[..., :m], _slot_numbers(m, q.device).expand(batch, heads, m))
    y, _ = ops.out_forward(q, k_sel, valid_k, w, rv, slot, index_q[..., :m], overwrite_rows)
    return y


class FlashCURAttention(CURAttention):
    """Drop-in FlashCUR attention: CUR's selection and parameters, Triton kernels for the products.

    Same arguments and defaults as :class:`attention.cur.CURAttention` minus ``score`` (softmax only).
    Raises at construction when neither CUDA nor ``TRITON_INTERPRET=1`` is available.
    """

    impl_family = "flashcur"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_landmarks: int = 64,
        selection: str = "abs",
        same_indices: bool = True,
        embed_column: int = 0,
        pinv_iters: int = 6,
        overwrite_rows: bool = True,
        force_cls: bool = False,
        pinv_init: str = "per_head",
    ):
        building_on_meta = torch.get_default_device().type == "meta"  # shapes only: the ops' fake implementations run
        if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1" or building_on_meta):
            raise RuntimeError(
                "attention=flashcur needs a CUDA GPU or the Triton interpreter (TRITON_INTERPRET=1, set before "
                "starting Python; CPU, slow); neither is available. Use attention=curformer on this machine."
            )
        super().__init__(
            num_heads, head_dim, num_landmarks, selection, same_indices, embed_column, pinv_iters, overwrite_rows, force_cls,
            pinv_init=pinv_init,
        )
        kernel_launch.check_head_dim(head_dim)
        if torch.cuda.is_available():  # tiles must fit this GPU's shared memory; fp32 is checked at launch
            capability = device_capability(torch.device("cuda", torch.cuda.current_device()))
            kernel_launch.check_shape(_padded_size(self.num_landmarks), head_dim, capability)
        else:
            _padded_size(self.num_landmarks)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        forms = impl.forms_for(self, q)  # attention.impl (family flashcur): refused where Triton cannot run
        index_q, index_k = self.select(q, k, key_mask, forms.selection)
        return flashcur_attention(
            q, k, v, key_mask, index_q, index_k, self.pinv_iters, self.overwrite_rows, self.pinv_init, forms.pinv
        )
