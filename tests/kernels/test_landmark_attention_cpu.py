"""`kernels.landmark_attention.cpu`: the few-keys and few-queries kernels and their backward kernels against the plain
PyTorch references of `kernels.landmark_attention.naive` (a dense float64 softmax and, their L1 form, a dense float64 L1
attention), values and gradients; the abs row sums of `kernels.selection` against `kernels.selection.naive`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attention.scores import L1Score
from kernels.landmark_attention import naive
from kernels.landmark_attention import cpu as landmark_kernels
from kernels.selection import naive as selection_naive
from kernels.selection import cpu as selection_cpu
from tests.tolerances import tolerance

WIDTH = landmark_kernels.vector_floats()  # d must be a multiple of it

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def operands(batch, heads, n, m, d, seed=0):
    """n queries and m keys, each in the (B, length, H, d) memory of the model's projections; a key mask with a
    sequence (batch 0, head 0) that has no real key, and others with random keys and a run of 40 keys masked."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, length, heads, d, generator=generator).transpose(1, 2) * scale
               for length, scale in ((n, 2), (m, 2), (m, 1)))
    key_mask = torch.rand(batch, heads, 1, m, generator=generator) > 0.3
    key_mask[..., 1:41] = False  # a whole key block of the few-queries kernel when m is large
    key_mask[..., 0] = True
    key_mask[0, 0] = False
    return q, k, v, key_mask


def tolerances(q, k, v, m, d):
    spread = ((q @ k.transpose(-1, -2)) * d**-0.5).abs().amax().item() * 2
    return tolerance(torch.float32, max(m, d), reductions=2, conditioning=spread, scale=v.abs().amax().item())


@pytest.mark.parametrize(("n", "m", "kind"), [(37, 1, "few_keys"), (37, 3, "few_keys"), (37, WIDTH, "few_keys"),
                                              (37, WIDTH + 1, "few_keys"), (37, 64, "few_keys"), (37, 128, "few_keys"),
                                              (1, 200, "few_queries"), (5, 129, "few_queries"),
                                              (64, 300, "few_queries"), (128, 150, "few_queries")])
@pytest.mark.parametrize("d", [WIDTH, 32, 64])
def test_forward_matches_dense_softmax(n, m, kind, d):
    if d % WIDTH:
        pytest.skip(f"d={d} is not a multiple of this CPU's vector width {WIDTH}")
    q, k, v, key_mask = operands(2, 2, n, m, d)
    assert landmark_kernels.kernel_for(q, k, v, key_mask) == kind
    y = landmark_kernels.attend(q, k, v, key_mask)
    assert y.stride() == F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask).stride()
    torch.testing.assert_close(y.double(), naive.attention(q, k, v, key_mask), **tolerances(q, k, v, m, d))
    assert y[0, 0].abs().max() == 0  # no real key: all weights 0


def backward_kernels_run(monkeypatch) -> list[str]:
    """The kinds of the backward kernels that run from now on (each call appends its kind)."""
    calls = []
    for kind, backward in list(landmark_kernels.BACKWARDS.items()):
        def spy(*args, kind=kind, backward=backward):
            calls.append(kind)
            return backward(*args)
        monkeypatch.setitem(landmark_kernels.BACKWARDS, kind, spy)
    return calls


@pytest.mark.parametrize(("n", "m", "kind"), [(19, 1, "few_keys"), (19, 5, "few_keys"), (45, 64, "few_keys"),
                                              (19, 128, "few_keys"), (1, 150, "few_queries"),
                                              (7, 150, "few_queries"), (64, 200, "few_queries"),
                                              (128, 300, "few_queries")])
@pytest.mark.parametrize("d", [WIDTH, 32, 64])
@pytest.mark.parametrize("kernel", [True, False], ids=["backward kernel", "ATen flash backward"])
def test_gradients_match_dense_softmax(n, m, kind, d, kernel, monkeypatch):
    """Gradients of the backward kernels (and of ATen's flash backward, which runs without them) against float64
    autograd, with the gradient in the (B, n, H, d) memory SDPA's output has."""
    if d % WIDTH:
        pytest.skip(f"d={d} is not a multiple of this CPU's vector width {WIDTH}")
    q, k, v, key_mask = operands(2, 2, n, m, d, seed=1)
    assert landmark_kernels.kernel_for(q, k, v, key_mask) == kind
    if not kernel:
        monkeypatch.setattr(landmark_kernels, "backward_library", lambda: None)
    calls = backward_kernels_run(monkeypatch)
    grad = torch.randn(2, n, 2, d, generator=torch.Generator().manual_seed(2)).transpose(1, 2)
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    landmark_kernels.attend(*inputs, key_mask).backward(grad)
    assert calls == ([kind] if kernel else [])
    reference = [x.double().requires_grad_() for x in (q, k, v)]
    naive.attention(*reference, key_mask).backward(grad.double())
    limits = tolerance(torch.float32, max(m, d, n), reductions=3, conditioning=40.0,
                       scale=max(x.grad.abs().amax().item() for x in reference))
    for name, ours, theirs in zip("qkv", inputs, reference):
        torch.testing.assert_close(ours.grad.double(), theirs.grad, **limits, msg=lambda text: f"d{name}: {text}")


@pytest.mark.parametrize(("n", "m", "kind"), [(19, 1, "few_keys"), (45, 64, "few_keys"), (19, 128, "few_keys"),
                                              (7, 150, "few_queries"), (64, 200, "few_queries"),
                                              (128, 300, "few_queries")])
@pytest.mark.parametrize("d", [WIDTH, 32, 64])
def test_l1_scores_match_dense_l1_attention(n, m, kind, d, monkeypatch):
    """``L1Score.attend`` on the kernels' L1 form: values and gradients against float64 autograd, with ties
    (q_ie = k_je exactly, where sign(0) = 0 must add nothing to dQ and dK) in a third of the entries."""
    if d % WIDTH:
        pytest.skip(f"d={d} is not a multiple of this CPU's vector width {WIDTH}")
    q, k, v, key_mask = operands(2, 2, n, m, d, seed=3)
    ties = torch.rand(2, 2, min(n, m), d, generator=torch.Generator().manual_seed(5)) < 0.3
    q[:, :, : min(n, m)] = torch.where(ties, k[:, :, : min(n, m)], q[:, :, : min(n, m)])
    assert landmark_kernels.kernel_for(q, k, v, key_mask) == kind
    calls = backward_kernels_run(monkeypatch)
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    y = L1Score(1.5).attend(inputs[0], inputs[1], key_mask, inputs[2])
    assert type(y.grad_fn).__name__ == "LandmarkAttentionBackward"
    reference = [x.double().requires_grad_() for x in (q, k, v)]
    expected = naive.l1_attention(*reference, key_mask, 1.5)
    spread = 1.5 * torch.cdist(q.double(), k.double(), p=1.0).amax().item() / d**0.5 * 2
    torch.testing.assert_close(y.double(), expected.detach(), **tolerance(
        torch.float32, max(m, d), reductions=2, conditioning=spread, scale=v.abs().amax().item()))
    assert y[0, 0].abs().max() == 0  # no real key: all weights 0
    grad = torch.randn(2, n, 2, d, generator=torch.Generator().manual_seed(2)).transpose(1, 2)
    y.backward(grad)
    expected.backward(grad.double())
    assert calls == [kind]
    limits = tolerance(torch.float32, max(m, d, n), reductions=3, conditioning=spread,
                       scale=max(x.grad.abs().amax().item() for x in reference))
    for name, ours, theirs in zip("qkv", inputs, reference):
        torch.testing.assert_close(ours.grad.double(), theirs.grad, **limits, msg=lambda text: f"d{name}: {text}")


@pytest.mark.parametrize(("n", "m"), [(11, 20), (20, 300)])
def test_broadcast_operands_and_no_mask(n, m):
    """Operands broadcast over the batch (one side's landmarks are (1, H, m, d)), no mask; gradients summed back."""
    d = 32 if 32 % WIDTH == 0 else WIDTH
    q, k, v, _ = operands(3, 2, n, m, d)
    small = q[:1] if n < m else v[:1]
    small = small.clone().requires_grad_()
    q, v = (small.expand(3, -1, -1, -1), v) if n < m else (q, small.expand(3, -1, -1, -1))
    y = landmark_kernels.attend(q, k, v, None)
    everything = torch.ones(3, 2, 1, m, dtype=torch.bool)
    torch.testing.assert_close(y.double(), naive.attention(q, k, v, everything), **tolerances(q, k, v, m, d))
    y.sum().backward()  # an expanded (stride 0) gradient, made contiguous for the backward kernel
    reference = small.detach().double().requires_grad_()
    q, v = (reference.expand(3, -1, -1, -1), v) if n < m else (q, reference.expand(3, -1, -1, -1))
    naive.attention(q, k, v, everything).sum().backward()
    limits = tolerance(torch.float32, max(m, d, n), reductions=3, conditioning=40.0,
                       scale=reference.grad.abs().amax().item())
    torch.testing.assert_close(small.grad.double(), reference.grad, **limits)


@pytest.mark.parametrize("case", ["many queries and keys", "float64", "mask per query"])
def test_other_operands_take_sdpa(case):
    """Outside the kernels' domain ``attend`` is SDPA itself (bit for bit)."""
    n, m = (129, 130) if case == "many queries and keys" else (9, 8)
    q, k, v, key_mask = operands(1, 2, n, m, 32)
    if case == "float64":
        q, k, v = q.double(), k.double(), v.double()
    if case == "mask per query":
        key_mask = key_mask.expand(1, 2, n, m)
    assert landmark_kernels.kernel_for(q, k, v, key_mask) is None
    assert torch.equal(landmark_kernels.attend(q, k, v, key_mask), F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask))


def test_padded_count():
    assert [landmark_kernels.padded(m) for m in (1, WIDTH, WIDTH + 1, 64, 128)] == [
        WIDTH, WIDTH, 2 * WIDTH, max(64, WIDTH), 128]


@pytest.mark.parametrize("d", [1, WIDTH, 32, WIDTH + 3])
def test_abs_row_sums_match_float64(d):
    """Rows in the (B, n, H, d) memory of the projections, a tail when d is not a multiple of the vector width."""
    x = torch.randn(2, 7, 3, d, generator=torch.Generator().manual_seed(4)).transpose(1, 2)
    sums = selection_cpu.abs_row_sums(x)
    assert sums.shape == (2, 3, 7)
    torch.testing.assert_close(sums.double(), selection_naive.abs_row_sums(x), **tolerance(torch.float32, d))


def test_abs_row_sums_of_other_tensors_are_abs_sum():
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    assert torch.equal(selection_cpu.abs_row_sums(x), x.abs().sum(-1))


def test_without_a_compiler_it_warns_and_runs_sdpa(monkeypatch, tmp_path):
    """No C++ compiler (``CXX`` names none, empty kernel cache): one warning, then SDPA's result exactly."""
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv("LRA_KERNEL_CACHE", str(tmp_path))
    landmark_kernels.library.cache_clear()
    try:
        q, k, v, key_mask = operands(1, 2, 9, 8, 32)
        with pytest.warns(UserWarning, match="without its CPU kernels: .*'no-such-compiler' was not found"):
            y = landmark_kernels.attend(q, k, v, key_mask)
        assert torch.equal(y, F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask))
        assert torch.equal(selection_cpu.abs_row_sums(q), q.abs().sum(-1))
    finally:
        landmark_kernels.library.cache_clear()


def test_flop_counter_sees_the_products():
    """Under ``FlopCounterMode`` (which cannot see a ctypes call) the SDPA form runs and is counted."""
    from lra.bench.counters import count_flops

    q, k, v, key_mask = operands(2, 2, 40, 64, 32)
    assert landmark_kernels.kernel_for(q, k, v, key_mask) == "few_keys"
    assert count_flops(lambda: landmark_kernels.attend(q, k, v, key_mask)) == 2 * 2 * (2 * 40 * 64 * 32) * 2
