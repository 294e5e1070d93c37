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

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


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


# B·H = 6: 31 chunks of 65 positions, the last padded with 16 zero rows (1999, prime) or 15 (2000: no divisor of it
# in [31, 31]); one chunk (97, prime: too short for two 64-token chunks)
@pytest.mark.parametrize("n", [1999, 2000, 97])
def test_rows_attention_is_masked_softmax_and_its_gradient(n):
    q_rows, k, v = inputs((2, 3, n, 8))
    q_rows = q_rows[:, :, :5].detach().requires_grad_()
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n // 2:] = False
    grads = assert_matches_dense(landmark_stages.rows_attention(q_rows, k, v, mask),
                                 dense_softmax(q_rows, k, v, mask[:, None, None, :]), (q_rows, k, v))
    assert grads[1][1, :, n // 2:].abs().max() == 0 and grads[2][1, :, n // 2:].abs().max() == 0  # pads get nothing


@pytest.mark.parametrize("n", [1999, 64])
def test_columns_attention_is_masked_softmax_and_its_gradient(n):
    q, k_cols, w = inputs((2, 3, n, 8))
    k_cols, w = (x[:, :, :6].detach().requires_grad_() for x in (k_cols, w))
    valid = torch.ones(2, 3, 6, dtype=torch.bool)
    valid[0, 1, 4:] = False
    assert_matches_dense(landmark_stages.columns_attention(q, k_cols, w, valid),
                         dense_softmax(q, k_cols, w, valid[:, :, None, :]), (q, k_cols, w))


def test_split_k_of_any_length_is_the_unchunked_product():
    """Bit for bit in float64 against one GEMM over ``n`` is not promised (another summation order), to 1e-12 it is;
    the rows that pad the last chunk are zero, so they add exactly nothing."""
    for n in (1999, 4093, 2000, 4096, 97):  # 4096: 64 chunks of 64, a view
        a, b = (x.detach() for x in inputs((1, 2, n, 3))[:2])
        c, length = landmark_stages.chunks(n, 2)
        assert (c - 1) * length < n <= c * length and (length >= landmark_stages.MIN_CHUNK or c == 1)
        a_c, b_c = landmark_stages.chunked(a, c, length), landmark_stages.chunked(b, c, length)
        assert a_c.shape[-3:] == (c, length, 3) and torch.count_nonzero(a_c.flatten(-3, -2)[..., n:, :]) == 0
        assert (a_c.data_ptr() == a.data_ptr()) == (c * length == n)  # a view when the chunks divide n
        torch.testing.assert_close(landmark_stages.split_k(a_c, b_c), a.mT @ b, rtol=1e-12, atol=1e-12)
        assert torch.equal(landmark_stages.unchunked(a_c, n), a)


def test_chunks_fill_two_waves_without_short_chunks():
    two_waves = landmark_stages.TWO_WAVES
    assert landmark_stages.chunks(4096, 16) == (32, 128)  # B 8, H 2: 16 · 32 = 512 programs, a divisor: a view
    assert landmark_stages.chunks(4096, 64) == (8, 512)  # B 32, H 2
    assert landmark_stages.chunks(2000, 64) == (5, 400)  # ListOps' length: 64 · 5 = 320
    assert landmark_stages.chunks(4096, 1024) == (1, 4096)  # the Fig. 4 shapes fill the GPU without a split
    assert landmark_stages.chunks(1999, 16) == (17, 118)  # a prime: 17 chunks, the last padded by 7 rows
    assert landmark_stages.chunks(97, 16) == (1, 97)  # too short for two chunks of 64
    for n in (1999, 2000, 4093, 4096, 1000, 130, 65536 + 1):
        for batch_heads in (1, 3, 16, 64, 300):
            c, length = landmark_stages.chunks(n, batch_heads)
            assert (c - 1) * length < n <= c * length  # no empty chunk
            assert length >= landmark_stages.MIN_CHUNK or c == 1
            # two waves, else chunks as short as they may be (one more would be shorter than MIN_CHUNK)
            assert batch_heads * c >= two_waves or length < 2 * landmark_stages.MIN_CHUNK


def test_chunk_sort_of_a_prime_length_picks_what_one_sort_picks():
    """:func:`attention.selection._top_by_sorting` over padded chunks (n = 1999, B·H = 16: 17 chunks of 118) ranks as
    one stable sort over ``n``: ties, masked tokens, NaN (``force_cls``) and the −inf pads included."""
    from attention.selection import _top_by_sorting

    generator = torch.Generator().manual_seed(3)
    priority = torch.randint(0, 40, (8, 2, 1999), generator=generator).float()  # many ties
    mask = torch.ones(8, 1999, dtype=torch.bool)
    mask[1, 30:] = False  # 30 real tokens: the m = 64 picks run into the masked ones
    for force_cls in (False, True):
        expected = torch.where(mask[:, None, :], priority, -torch.inf)
        if force_cls:
            expected[..., 0] = torch.nan
        expected = expected.sort(dim=-1, descending=True, stable=True).indices[..., :64]
        assert torch.equal(_top_by_sorting(priority.clone(), mask, 64, force_cls), expected)


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
