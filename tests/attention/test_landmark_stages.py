"""The n-sized stages of the fused landmark attention (:mod:`attention.landmark_stages`) against dense references, and
the bf16 forms of CUR and Nyström against float64 within the tolerance their dtype gives (tests/tolerances.py)."""

from __future__ import annotations

import pytest
import torch

from attention import landmark_stages
from attention.cur import cur_attention
from attention.nystrom import NystromAttention
from attention.selection import select_indices
from tests.conftest import auto_picks
from tests.tolerances import tolerance


def dense_softmax(q, k, v, allowed):
    """``softmax(q kᵀ/√d, over keys where allowed) v`` in float64, ``allowed`` broadcasting to ``(B, H, a, b)``."""
    scores = (q @ k.mT) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~allowed, -torch.inf), -1) @ v


def assert_matches_dense(out, ref, leaves):
    """``out`` equals the float64 dense ``ref``, and so do their gradients with respect to ``leaves`` (of one random
    projection of the output); returns ``out``'s gradients."""
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    probe = torch.randn_like(ref)
    grads = torch.autograd.grad((out * probe).sum(), leaves)
    for grad, expected in zip(grads, torch.autograd.grad((ref * probe).sum(), leaves)):
        torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)
    return grads


def inputs(shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("n", [96, 97])  # B·H = 6: 48 chunks of 2 positions; 97 (prime): 97 chunks of one
def test_rows_attention_is_masked_softmax_and_its_gradient(n):
    q_rows, k, v = inputs((2, 3, n, 8))
    q_rows = q_rows[:, :, :5].detach().requires_grad_()
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n // 2:] = False
    grads = assert_matches_dense(landmark_stages.rows_attention(q_rows, k, v, mask),
                                 dense_softmax(q_rows, k, v, mask[:, None, None, :]), (q_rows, k, v))
    assert grads[1][1, :, n // 2:].abs().max() == 0 and grads[2][1, :, n // 2:].abs().max() == 0  # pads get nothing


def test_columns_attention_is_masked_softmax_and_its_gradient():
    q, k_cols, w = inputs((2, 3, 64, 8))
    k_cols, w = (x[:, :, :6].detach().requires_grad_() for x in (k_cols, w))
    valid = torch.ones(2, 3, 6, dtype=torch.bool)
    valid[0, 1, 4:] = False
    assert_matches_dense(landmark_stages.columns_attention(q, k_cols, w, valid),
                         dense_softmax(q, k_cols, w, valid[:, :, None, :]), (q, k_cols, w))


def test_chunks_fill_two_waves_with_a_divisor_of_n():
    assert landmark_stages.chunks(4096, 16) == 32  # B 8, H 2: 16 · 32 = 512 programs
    assert landmark_stages.chunks(4096, 64) == 8  # B 32, H 2
    assert landmark_stages.chunks(2000, 64) == 5  # ListOps' length: 64 · 5 = 320
    assert landmark_stages.chunks(4096, 1024) == 1  # the Fig. 4 shapes fill the GPU without a split
    assert landmark_stages.chunks(97, 16) == 97  # a prime: one position a chunk, still exact
    for n, batch_heads in [(4096, 16), (2000, 64), (1000, 3), (97, 16)]:
        c = landmark_stages.chunks(n, batch_heads)
        assert n % c == 0 and (batch_heads * c >= landmark_stages.TWO_WAVES or c == n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_cur_in_low_precision_is_within_its_dtype_tolerance_of_float64(monkeypatch, dtype):
    """The fused CUR (the CUDA path, here on CPU tensors) at the same selected rows: float32 and bf16 outputs and
    gradients against float64. The tolerance is the dtype's (scores, weights and partials rounded in ``dtype``, sums
    in float32 over ``n``; the gradients pass through the pseudo-inverse's backward, conditioning 8)."""
    auto_picks(monkeypatch, "cur", "fused")  # attention.impl=fused on CPU tensors
    batch, heads, n, d, m = 2, 2, 96, 16, 16
    q, k, v = (x.detach() for x in inputs((batch, heads, n, d), seed=1))
    mask = torch.ones(batch, n, dtype=torch.bool)
    mask[1, 70:] = False
    index_q, index_k = select_indices(q, k, mask, m)
    probe = torch.linspace(-1, 1, d, dtype=torch.float64)

    def run(x_dtype):
        leaves = [x.to(x_dtype).requires_grad_() for x in (q, k, v)]
        y = cur_attention(*leaves, mask, index_q, index_k)
        grads = torch.autograd.grad((y.double() * probe).sum(), leaves)
        return y.double(), [g.double() for g in grads]

    y_ref, grads_ref = run(torch.float64)
    y, grads = run(dtype)
    real = mask[:, None, :, None]
    scale = y_ref.abs().max().item()
    torch.testing.assert_close(y * real, y_ref * real, **tolerance(dtype, n, scale=scale, accumulate=torch.float32))
    for grad, expected in zip(grads, grads_ref):
        torch.testing.assert_close(grad, expected,
                                   **tolerance(dtype, n, scale=expected.abs().max().item(), accumulate=torch.float32,
                                               conditioning=8))


def test_fused_nystrom_in_bf16_is_within_its_dtype_tolerance_of_float64(monkeypatch):
    auto_picks(monkeypatch, "nystrom", "fused")  # attention.impl=fused on CPU tensors
    module = NystromAttention(num_heads=2, head_dim=16, num_landmarks=16, conv_kernel_size=None)
    q, k, v = (x.detach() for x in inputs((2, 2, 96, 16), seed=2))
    mask = torch.ones(2, 96, dtype=torch.bool)
    mask[0, 50:] = False
    y_ref = module(q, k, v, mask)
    y = module(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask).double()
    real = mask[:, None, :, None]
    torch.testing.assert_close(y * real, y_ref * real,
                               **tolerance(torch.bfloat16, 96, scale=y_ref.abs().max().item(), accumulate=torch.float32))
