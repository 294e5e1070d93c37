"""L1-distance attention (EcoTransformer eq. 1) against the dense (B, H, n, n, d) reference of kernels/l1/naive.py.

The CPU path (compiled kernels of ``kernels/l1/cpu.cpp``, flash-style chunks) and the PyTorch path of
other devices (``attention.impl=pytorch`` runs it on CPU) are both checked.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attention.l1 import L1Attention
from attention.scores import L1Score
from kernels.l1 import naive as l1_naive
from kernels.l1 import cpu as l1_kernels
from kernels.l1.cpu import L1AttentionFunction
from lra.build import build_attention
from tests.attention_reference import (
    assert_padding_invariant,
    bf16_training_step,
    dense_l1_weights,
    max_real_error,
    padded_mask,
    random_qkv,
)
from tests.conftest import auto_picks, compose_config

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


@pytest.fixture(params=["cpu_kernel", "torch_path"])
def path(request, monkeypatch):
    """The ``cpu`` form, then the ``pytorch`` form (``attention.impl``) of every module and score the test builds."""
    auto_picks(monkeypatch, "l1", "cpu" if request.param == "cpu_kernel" else "pytorch")
    return request.param


def grads(fn, *inputs):
    """``fn(*inputs)`` and the gradients of ``Σ fn(...) ⊙ w`` (fixed random ``w``) w.r.t. each input."""
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*inputs)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    return (out.detach(), *torch.autograd.grad((out * weight).sum(), inputs))


@pytest.mark.parametrize("lam", [1.0, 3.0])
def test_matches_dense_reference_with_padding(lam, path):
    q, k, v = random_qkv(n=30, d=8)
    mask = padded_mask(2, 30, [30, 17])
    y = L1Attention(2, 8, lam=lam)(q, k, v, mask)
    assert max_real_error(y, l1_naive.attention(q, k, v, mask, lam), mask) < 1e-12


@pytest.mark.parametrize("n, d, budget", [(37, 5, 2 * 2 * 37 * 3), (45, 32, 2 * 2 * 45 * 16), (19, 17, 1 << 21)])
def test_cpu_kernel_forward_and_gradients_match_dense(monkeypatch, n, d, budget):
    """Odd n, d not a multiple of the vector width, several query chunks (the last one partial), padding."""
    monkeypatch.setattr(L1AttentionFunction, "budget", budget)
    q, k, v = random_qkv(n=n, d=d, seed=3)
    mask = padded_mask(2, n, [n, n // 2])
    fast = grads(lambda q, k, v: L1Attention(2, d, lam=2.0)(q, k, v, mask), q, k, v)
    dense = grads(lambda q, k, v: l1_naive.attention(q, k, v, mask, 2.0), q, k, v)
    real = mask[:, None, :, None]
    assert (fast[0] - dense[0]).abs().masked_fill(~real, 0).max() < 1e-12
    for name, a, b in zip("qkv", fast[1:], dense[1:]):
        assert torch.allclose(a, b, atol=1e-12), f"d{name}: {(a - b).abs().max()}"


def test_sign_of_zero_difference_is_zero():
    """Integer-valued q, k tie in many coordinates: the kernels must use sign(0) = 0, as ``abs``'s backward."""
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randint(-2, 3, (2, 2, 20, 16), generator=generator).double() for _ in range(2))
    assert (q[:, :, :, None] == k[:, :, None]).float().mean() > 0.1
    v = torch.randn(2, 2, 20, 16, generator=generator, dtype=torch.float64)
    mask = torch.ones(2, 20, dtype=torch.bool)
    fast = grads(lambda q, k, v: L1Attention(2, 16)(q, k, v, mask), q, k, v)
    dense = grads(lambda q, k, v: l1_naive.attention(q, k, v, mask), q, k, v)
    for a, b in zip(fast, dense):
        assert torch.allclose(a, b, atol=1e-12)


def test_sign_closest_key_gets_the_largest_weight(path):
    k = torch.tensor([[0.0, 0.0], [5.0, 5.0], [1.0, -1.0]]).view(1, 1, 3, 2)
    q = torch.tensor([[4.5, 5.5]]).view(1, 1, 1, 2)
    weights = L1Score()(q, k)
    assert weights.argmax().item() == 1
    expected = torch.softmax(-torch.tensor([10.0, 1.0, 10.0]) / 2**0.5, 0)
    assert torch.allclose(weights.flatten(), expected)


def test_masked_keys_get_exactly_zero_weight(path):
    q, k, _ = random_qkv(n=10, d=4)
    mask = padded_mask(2, 10, [10, 6])
    weights = L1Score()(q, k, mask[:, None, None, :])
    assert (weights[1, :, :, 6:] == 0).all()


@pytest.mark.parametrize("a, b", [(33, 5), (5, 33), (16, 64)])
def test_score_on_rectangular_blocks_matches_dense(a, b, path, monkeypatch):
    """CUR's n × m and m × n blocks: the score and its gradients, with masked keys."""
    monkeypatch.setattr(l1_kernels, "L1_GRAD_BUDGET", 50)  # the PyTorch path's backward in several query chunks
    q, _, _ = random_qkv(n=a, d=12, seed=2)
    k, _, _ = random_qkv(n=b, d=12, seed=4)
    key_mask = padded_mask(2, b, [b, b - 2])
    fast = grads(lambda q, k: L1Score(1.5)(q, k, key_mask[:, None, None, :]), q, k)
    dense = grads(lambda q, k: dense_l1_weights(q, k, key_mask, 1.5), q, k)
    assert fast[0].shape == (2, 2, a, b)
    for x, y in zip(fast, dense):
        assert torch.allclose(x, y, atol=1e-12)


def test_gradcheck(path):
    q, k, v = (x.requires_grad_() for x in random_qkv(batch=1, n=6, d=3))
    mask = padded_mask(1, 6, [5])
    assert torch.autograd.gradcheck(lambda q, k, v: L1Attention(2, 3, lam=2.0)(q, k, v, mask), (q, k, v))


def test_gradcheck_of_the_score(path):
    q = torch.randn(1, 2, 5, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 7, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k: L1Score(2.0)(q, k), (q, k))


def test_dropout_masks_are_regenerated_in_backward(monkeypatch):
    """Training-mode dropout of the CPU path equals the dense computation with the same keep masks."""
    monkeypatch.setattr(L1AttentionFunction, "budget", 2 * 2 * 24 * 8)  # 8-row chunks: one mask per chunk
    q, k, v = random_qkv(n=24, d=8, seed=5)
    mask = padded_mask(2, 24, [24, 13])
    seed, p = 1234, 0.3
    keep = torch.cat([l1_kernels._keep(seed, start, (4, 8, 24), p, torch.float64) for start in range(0, 24, 8)], 1)
    assert 0 < (keep == 0).float().mean() < 1
    fast = grads(lambda q, k, v: L1AttentionFunction.apply(q, k, v, mask, 1.0, p, seed), q, k, v)
    dense = grads(lambda q, k, v: (dense_l1_weights(q, k, mask) * keep.view(2, 2, 24, 24)) @ v, q, k, v)
    for a, b in zip(fast, dense):
        assert torch.allclose(a, b, atol=1e-12)


def test_seeded_training_steps_repeat():
    attn = L1Attention(2, 8, dropout=0.2).train()
    q, k, v = random_qkv(n=16, d=8, dtype=torch.float32)
    mask = padded_mask(2, 16, [16, 9])
    outputs = []
    for _ in range(2):
        torch.manual_seed(7)
        outputs.append(attn(q, k, v, mask))
    assert torch.equal(*outputs) and not torch.equal(outputs[0], attn.eval()(q, k, v, mask))


def test_sequence_without_real_tokens_gives_zeros_like_the_torch_path(monkeypatch):
    q, k, v = random_qkv(n=12, d=4)
    mask = padded_mask(2, 12, [12, 0])
    fast = grads(lambda q, k, v: L1Attention(2, 4)(q, k, v, mask), q, k, v)
    auto_picks(monkeypatch, "l1", "pytorch")
    reference = grads(lambda q, k, v: L1Attention(2, 4)(q, k, v, mask), q, k, v)
    assert (fast[0][1] == 0).all()
    for a, b in zip(fast, reference):
        assert torch.allclose(a, b, atol=1e-12)


def test_kernels_give_identical_results_on_several_threads():
    q, k, g = torch.randn(3, 21, 32), torch.randn(3, 37, 32), torch.randn(3, 21, 37)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            dq, dk = torch.empty_like(q), torch.zeros_like(k)
            l1_kernels.sign_grad(g, q, k, dq, dk, 0.5)
            results.append((l1_kernels.distance(q, k.transpose(1, 2), -0.5), dq, dk))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("d", [1, 5, 24, 40, 56, 68])
def test_kernels_match_a_float64_reference_for_every_tile_and_tail(dtype, d):
    """Both kernels called directly (float32 too, not only the attention tests' float64) on a row slice of the
    queries, against dense float64 sums. After padding, the d values give every column-group size of every
    vector width (4, 8, 16 floats and 2, 4, 8 doubles: SSE2, AVX2, AVX-512); 19 query rows end in a tail
    after whole row tiles (8, 6, 4, 3 or 2 rows), 45 keys in a tail after the distance kernel's column tiles.
    Small integers make every sum exact, also in float32, and tie many coordinates (sign(0) = 0)."""
    generator = torch.Generator().manual_seed(d)
    problems, a, b, skip = 3, 19, 45, 2

    def ints(*shape):
        return torch.randint(-3, 4, shape, generator=generator).to(dtype)

    q_all, k, g = ints(problems, skip + a + 2, d), ints(problems, b, d), ints(problems, a, b)
    rows = slice(skip, skip + a)  # a query chunk: rows of a longer sequence
    diff = q_all[:, rows, None].double() - k[:, None].double()  # (P, a, b, d)
    assert (diff == 0).double().mean() > 0.1
    distance = l1_kernels.distance(q_all[:, rows], k.transpose(1, 2), -0.5)
    assert torch.equal(distance.double(), -0.5 * diff.abs().sum(-1))

    q_padded, k_padded = l1_kernels.pad_columns(q_all), l1_kernels.pad_columns(k)
    dq, dk = torch.full_like(q_padded, float("nan")), torch.ones_like(k_padded)
    l1_kernels.sign_grad(g, q_padded[:, rows], k_padded, dq[:, rows], dk, 0.5)
    contribution = g[..., None].double() * diff.sign()  # (P, a, b, d)
    assert torch.equal(dq[:, rows, :d].double(), 0.5 * contribution.sum(2))
    assert torch.equal(dk[..., :d].double(), 1 - 0.5 * contribution.sum(1))
    assert (dq[:, rows, d:] == 0).all() and (dk[..., d:] == 1).all()  # padded columns: sign(0 − 0) = 0
    assert dq[:, :skip].isnan().all() and dq[:, skip + a:].isnan().all()  # rows outside the chunk untouched


class LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an ATen op returns (every allocation goes through one)."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


def test_memory_is_bounded_by_query_chunks(monkeypatch):
    """No n × n tensor in forward or backward, and nothing quadratic saved: at most (B·H, chunk, n) blocks."""
    batch, heads, n, d, chunk = 2, 2, 128, 4, 32
    monkeypatch.setattr(L1AttentionFunction, "budget", batch * heads * chunk * n)
    q, k, v = (x.requires_grad_() for x in random_qkv(batch=batch, heads=heads, n=n, d=d, dtype=torch.float32))
    mask = padded_mask(batch, n, [n, 90])
    saved = []
    with LargestTensor() as mode, torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t,
                                                                           lambda t: t):
        L1Attention(heads, d, dropout=0.1).train()(q, k, v, mask).sum().backward()
    assert mode.largest == batch * heads * chunk * n < batch * heads * n * n
    assert max(saved) <= batch * heads * n * d


def test_kernels_reject_mixed_dtypes():
    """Raw pointers: a float64 q with float32 keys must be an error, not a misread buffer."""
    with pytest.raises(ValueError, match="all float32 or all float64"):
        l1_kernels.distance(torch.randn(1, 4, 16, dtype=torch.float64), torch.randn(1, 16, 4), 1.0)


def test_padding_invariance(path):
    assert_padding_invariant(L1Attention(2, 8))


def test_low_precision_inputs_run_in_float32_and_keep_their_dtype(path):
    q, k, v = random_qkv(n=20, d=8, dtype=torch.float32)
    mask = padded_mask(2, 20, [20, 11])
    low = L1Attention(2, 8)(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
    reference = L1Attention(2, 8)(*(x.bfloat16().float() for x in (q, k, v)), mask)
    assert low.dtype == torch.bfloat16
    assert max_real_error(low.float(), reference, mask) < 1e-2


def test_bf16_training_step_is_finite(path):
    bf16_training_step(["attention=l1"])


def test_config_and_bad_lambda():
    attn = build_attention(compose_config(["attention=l1", "attention.lam=3"]).attention, 2, 32)
    assert isinstance(attn, L1Attention) and attn.score.lam == 3.0
    with pytest.raises(ValueError, match="lam"):
        build_attention(compose_config(["attention=l1", "attention.lam=-1"]).attention, 2, 32)
