"""Nyström attention (Xiong et al. 2021) against dense softmax attention written in the test."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention import paths
from attention.landmark_means import fused_segment_means
from kernels.common import build
from kernels.seqconv import cpu as seqconv
from attention.nystrom import NystromAttention, SequenceConv, segment_means
from lra.build import build_attention
from tests.attention_reference import (
    assert_padding_invariant,
    bf16_training_step,
    dense_softmax_weights,
    low_and_full_rank_qk,
    max_real_error,
    padded_mask,
    random_qkv,
)
from tests.conftest import compose_config, run_cli
from tests.tolerances import tolerance

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def test_segment_means_are_mask_aware_with_mixed_sizes():
    x = torch.arange(2 * 1 * 10 * 1, dtype=torch.float64).view(2, 1, 10, 1)
    mask = padded_mask(2, 10, [10, 7])
    means, valid = segment_means(x, mask, 3)
    # ranks r -> segment r*3//n_real: 10 real -> sizes 4,3,3; 7 real -> sizes 3,2,2 (pads never included)
    assert means[0, 0, :, 0].tolist() == [1.5, 5.0, 8.0]
    assert means[1, 0, :, 0].tolist() == [11.0, 13.5, 15.5]
    assert valid.all()
    _, valid = segment_means(x, padded_mask(2, 10, [10, 2]), 3)
    assert valid[1].tolist() == [True, True, False]  # ranks 0, 1 -> segments 0, 1


def test_fused_segment_means_equal_the_cpu_forms_values_validity_and_gradients():
    """The fused forms' landmarks (one attention call with equal scores) against :func:`segment_means`: pads inside
    and after the sequence, before its first real token, fewer real tokens than segments, none at all."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 2, 23, 6, dtype=torch.float64, generator=generator)
    mask = padded_mask(4, 23, [23, 17, 4, 0])
    mask[0, 5] = mask[1, 0] = mask[1, 1] = False
    upstream = torch.randn(4, 2, 7, 6, dtype=torch.float64, generator=generator)
    results = []
    for form in (segment_means, lambda x, mask, m: fused_segment_means(
            x, mask, paths.masking_bias(mask, x.dtype)[:, None, None, :], m)):
        leaf = x.clone().requires_grad_()
        means, valid = form(leaf, mask, 7)
        (grad,) = torch.autograd.grad(means, leaf, upstream * valid[:, None, :, None])
        results.append((means * valid[:, None, :, None], valid, grad))
    assert results[1][1][2].tolist() == [True, True, False, True, False, True, False]  # ranks 0..3: r·7//4
    assert not results[1][1][3].any()
    for cpu, fused in zip(*results):
        torch.testing.assert_close(fused, cpu, atol=1e-12, rtol=0)


def test_landmark_kernels_under_the_interpreter():
    """``tests/kernels/test_segment_means.py`` with ``TRITON_INTERPRET=1`` (the landmark kernels against the CPU forms, and
    the whole fused Nyström with them), in a subprocess: the interpreter is chosen when the kernels are defined."""
    proc = run_cli(["-m", "pytest", "tests/kernels/test_segment_means.py", "-q", "-k", "not compile", "-p", "no:cacheprovider"],
                   env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""})  # CPU tensors, with or without a GPU
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("n, size", [(1, 5), (31, 3), (100, 35)])
def test_fused_conv_equals_the_cpu_forms(n, size):
    """:meth:`SequenceConv.fused` (one depthwise ``conv2d``) against the CPU form, values and gradients."""
    generator = torch.Generator().manual_seed(n)
    conv = SequenceConv(2, size).double()
    x = torch.randn(2, n, 2, 8, generator=generator, dtype=torch.float64).transpose(1, 2).requires_grad_()
    mask = torch.rand(2, n, generator=generator) > 0.3
    upstream = torch.randn(2, 2, n, 8, generator=generator, dtype=torch.float64)
    cpu, fused = conv(x, mask), conv.fused(x, mask)
    torch.testing.assert_close(fused, cpu, atol=1e-12, rtol=0)
    for a, b in zip(torch.autograd.grad(cpu, (x, conv.weight), upstream), torch.autograd.grad(fused, (x, conv.weight), upstream)):
        torch.testing.assert_close(b, a, atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("d", [4, 40])
def test_segment_means_of_either_memory_layout_and_the_kernel_are_the_same(dtype, d, monkeypatch):
    """Rows of d values for contiguous (B, H, n, d) input, rows of H·d for the model's (B, n, H, d) memory (what
    ``MultiHeadAttention`` passes), by the ``scatter_add`` of other devices and by the CPU kernel
    (``kernels.seqconv.cpu.SegmentSums``): the same sums in the same order, and their gradients, bit for bit."""
    x = torch.randn(2, 3, 37, d, dtype=dtype, generator=torch.Generator().manual_seed(0))
    mask = padded_mask(2, 37, [37, 20])
    mask[0, 5] = False  # a pad inside the sequence
    model_layout = x.transpose(1, 2).contiguous().transpose(1, 2)
    assert x.is_contiguous() and model_layout.transpose(1, 2).is_contiguous()
    results = []
    for kernel in (True, False):
        for source in (x, model_layout):
            leaf = source.detach().requires_grad_()
            means, valid = segment_means(leaf, mask, 6, kernel)
            assert (type(means.grad_fn.next_functions[0][0]).__name__ == "SegmentSumsBackward") == kernel
            (grad,) = torch.autograd.grad((means * torch.arange(float(d), dtype=dtype)).sum(), leaf)
            results.append((means, valid, grad))
    assert results[0][2][0, :, 5].abs().max() == 0  # the pad row gets no gradient
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("lengths", [[40, 40], [40, 23]])
@pytest.mark.usefixtures("landmark_forms")
def test_equals_exact_attention_when_every_real_token_is_a_landmark(lengths):
    q, k, v = random_qkv(n=40, d=8)
    mask = padded_mask(2, 40, lengths)
    attn = NystromAttention(2, 8, num_landmarks=40, pinv_iters=30, conv_kernel_size=None)
    error = max_real_error(attn(q, k, v, mask), dense_softmax_weights(q, k, mask) @ v, mask)
    assert error < 1e-5


@pytest.mark.usefixtures("landmark_forms")
def test_low_rank_inputs_are_approximated_far_better_than_full_rank():
    (q_low, k_low), (q_full, k_full) = low_and_full_rank_qk()
    v = random_qkv(n=256, d=16)[2]
    mask = padded_mask(2, 256, [256, 200])
    attn = NystromAttention(2, 16, num_landmarks=16, pinv_iters=20, conv_kernel_size=None)
    low = max_real_error(attn(q_low, k_low, v, mask), dense_softmax_weights(q_low, k_low, mask) @ v, mask)
    full = max_real_error(attn(q_full, k_full, v, mask), dense_softmax_weights(q_full, k_full, mask) @ v, mask)
    assert low * 8 < full, (low, full)


@pytest.mark.parametrize("n", [37, 64, 101])
@pytest.mark.usefixtures("landmark_forms")
def test_any_length_and_conv_adds_a_depthwise_term(n):
    q, k, v = random_qkv(batch=1, n=n, d=8)
    mask = padded_mask(1, n, [n - 3])
    with_conv = NystromAttention(2, 8, num_landmarks=8, conv_kernel_size=5).double()
    without = NystromAttention(2, 8, num_landmarks=8, conv_kernel_size=None)
    expected_conv = torch.zeros_like(v)
    weight = with_conv.conv.weight[:, 0, :]  # (H, 5)
    masked_v = v * mask[:, None, :, None]
    for h in range(2):
        for i in range(n):
            for t in range(5):
                j = i + t - 2
                if 0 <= j < n:
                    expected_conv[0, h, i] += weight[h, t] * masked_v[0, h, j]
    assert torch.allclose(with_conv(q, k, v, mask) - without(q, k, v, mask), expected_conv, atol=1e-10)


@pytest.mark.parametrize("kernel", [True, False], ids=["cpu_kernel", "banded"])
@pytest.mark.parametrize("n, size", [(1, 5), (31, 3), (32, 35), (100, 35), (257, 65)])
def test_sequence_conv_equals_the_former_conv2d_values_and_gradients(n, size, kernel, monkeypatch):
    """Against ``F.conv2d`` with the former ``nn.Conv2d`` layout (weight ``(H, 1, K, 1)``, kernel ``(K, 1)``) and
    ``F.conv1d`` with ``groups = H`` over ``(B·d, H, n)``: lengths below, at and across the 32-row blocks, for the
    CPU kernel of ``kernels/seqconv/cpu.cpp`` and for the banded products (other devices, compiled code)."""
    generator = torch.Generator().manual_seed(n)
    conv = SequenceConv(3, size).double()
    x = torch.randn(2, 3, n, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    weight_2d = conv.weight.detach()[..., None].requires_grad_()
    expected = F.conv2d(x, weight_2d, padding=(size // 2, 0), groups=3)
    as_conv1d = F.conv1d(x.permute(0, 3, 1, 2).reshape(8, 3, n), conv.weight, padding=size // 2, groups=3)
    got = conv(x, kernel=kernel)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(as_conv1d.view(2, 4, 3, n).permute(0, 2, 3, 1), expected, atol=1e-12, rtol=0)
    grad = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    expected_grads = torch.autograd.grad(expected, (x, weight_2d), grad)
    got_grads = torch.autograd.grad(got, (x, conv.weight), grad)
    torch.testing.assert_close(got_grads[0], expected_grads[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(got_grads[1], expected_grads[1][..., 0], atol=1e-12, rtol=0)


class FormerNystrom(nn.Module):
    """The parameters of ``NystromAttention`` before its conv became :class:`SequenceConv` (same constructor call)."""

    def __init__(self, heads: int, size: int):
        super().__init__()
        self.conv = nn.Conv2d(heads, heads, (size, 1), padding=(size // 2, 0), groups=heads, bias=False)


def test_checkpoints_of_the_former_conv2d_layout_load(tmp_path):
    former = FormerNystrom(2, 5).double()
    torch.save(former.state_dict(), tmp_path / "former.pt")
    state = torch.load(tmp_path / "former.pt")
    assert state["conv.weight"].shape == (2, 1, 5, 1)
    attn = NystromAttention(2, 8, num_landmarks=4, conv_kernel_size=5).double()
    attn.load_state_dict(state, strict=True)
    assert attn.conv.weight.shape == (2, 1, 5) and torch.equal(attn.conv.weight[..., None], former.conv.weight)
    q, k, v = random_qkv(batch=2, n=21, d=8)
    mask = padded_mask(2, 21, [21, 15])
    without = NystromAttention(2, 8, num_landmarks=4, conv_kernel_size=None)
    with torch.no_grad():
        expected_conv = former.conv(v * mask[:, None, :, None])
        torch.testing.assert_close(attn(q, k, v, mask) - without(q, k, v, mask), expected_conv, atol=1e-12, rtol=0)
    attn.load_state_dict(attn.state_dict(), strict=True)  # the new layout round-trips
    with pytest.raises(RuntimeError, match="size mismatch"):
        attn.load_state_dict({"conv.weight": torch.zeros(2, 1, 7, 1)})


@pytest.mark.usefixtures("landmark_forms")
def test_padding_invariance():
    assert_padding_invariant(NystromAttention(2, 8, num_landmarks=6, conv_kernel_size=5))
    assert_padding_invariant(NystromAttention(2, 8, num_landmarks=64, conv_kernel_size=None))


@pytest.mark.usefixtures("landmark_forms")
def test_gradcheck():
    q, k, v = (x.requires_grad_() for x in random_qkv(batch=1, n=9, d=3))
    mask = padded_mask(1, 9, [7])
    attn = NystromAttention(2, 3, num_landmarks=3, pinv_iters=3, conv_kernel_size=3).double()
    assert torch.autograd.gradcheck(lambda q, k, v: attn(q, k, v, mask), (q, k, v))


@pytest.mark.usefixtures("landmark_forms")
def test_bf16_training_step_is_finite():
    bf16_training_step(["attention=nystromformer", "attention.num_landmarks=8"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("attention.num_landmarks=0", "num_landmarks"),
        ("attention.pinv_iters=-2", "pinv_iters"),
        ("attention.pinv_init=batch", "attention.pinv_init"),
        ("attention.conv_kernel_size=4", "conv_kernel_size"),
    ],
)
def test_bad_config_is_a_clear_error_at_build_time(override, message):
    with pytest.raises(ValueError, match=message):
        build_attention(compose_config(["attention=nystromformer", override]).attention, 2, 32)


def test_config_defaults():
    attn = build_attention(compose_config(["attention=nystromformer"]).attention, 2, 32)
    assert attn.num_landmarks == 64 and attn.pinv_iters == 6 and attn.conv.weight.shape == (2, 1, 35)
    attn = build_attention(compose_config(["attention=nystromformer", "attention.conv_kernel_size=null"]).attention, 2, 32)
    assert attn.conv is None


def dense_nystrom(q, k, v, m, pinv_iters, pinv_init):
    """Full-length sequences, ``m`` dividing ``n``: landmarks = means of ``n/m`` consecutive rows, the three softmax
    kernels from explicit logits, their pseudo-inverse by the float64 reference of ``kernels/pinv/naive.py``."""
    from kernels.pinv.naive import reference_pinv

    batch, heads, n, d = q.shape
    q_land = q.reshape(batch, heads, m, n // m, d).mean(-2)
    k_land = k.reshape(batch, heads, m, n // m, d).mean(-2)
    kernel = lambda a, b: torch.softmax(a @ b.transpose(-1, -2) / d**0.5, -1)  # noqa: E731
    k2_pinv = reference_pinv(kernel(q_land, k_land), pinv_iters, pinv_init)
    return kernel(q, k_land) @ k2_pinv @ kernel(q_land, k) @ v


@pytest.mark.parametrize("pinv_init", ["per_head", "global"])
@pytest.mark.usefixtures("landmark_forms")
def test_matches_dense_nystrom_with_either_pinv_init(pinv_init):
    """Through the config (``attention.pinv_init``), at the default 6 iterations, heads of different scale."""
    q, k, v = random_qkv(batch=2, heads=2, n=24, d=32)
    q[:, 1], k[:, 1] = 3 * q[:, 1], 3 * k[:, 1]  # head 1 sharper: larger column sums of k2
    cfg = compose_config(["attention=nystromformer", "attention.num_landmarks=6", "attention.conv_kernel_size=null",
                          f"attention.pinv_init={pinv_init}"])
    attn = build_attention(cfg.attention, 2, 32)
    assert attn.pinv_init == pinv_init and attn.pinv_iters == 6
    got = attn(q, k, v, torch.ones(2, 24, dtype=torch.bool))
    torch.testing.assert_close(got, dense_nystrom(q, k, v, 6, 6, pinv_init), atol=1e-10, rtol=0)
    other = dense_nystrom(q, k, v, 6, 6, "global" if pinv_init == "per_head" else "per_head")
    assert (got - other).abs().max() > 1e-3  # the option changes the numbers at 6 iterations


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n", [3, 37, 64, 101])
@pytest.mark.parametrize("d", [20, 40])
def test_cpu_conv_kernel_with_mask_and_sum_matches_the_banded_products(dtype, n, d, monkeypatch):
    """``base + conv(x ⊙ mask)`` with x and base in the model's (B, n, H, d) memory and d = 20 or 40 (chunks of two
    vectors, one vector and a scalar tail on every vector width): the CPU kernel against the banded products,
    values and the gradients of x, the kernel and base (float32: a 35-term sum and its rounding, relative to the
    size of the terms)."""
    generator = torch.Generator().manual_seed(n)
    conv = SequenceConv(2, 35).to(dtype)
    x = torch.randn(2, n, 2, d, generator=generator, dtype=dtype).transpose(1, 2).requires_grad_()
    base = torch.randn(2, n, 2, d, generator=generator, dtype=dtype).transpose(1, 2).requires_grad_()
    mask = torch.rand(2, n, generator=generator) > 0.3
    upstream = torch.randn(2, 2, n, d, generator=generator, dtype=dtype)
    results = []
    for kernel in (True, False):
        y = conv(x, mask, base, kernel=kernel)
        results.append((y, *torch.autograd.grad(y, (x, conv.weight, base), upstream)))
    big = lambda t: float(t.detach().abs().max())  # noqa: E731
    terms = {  # sums: y and ∂x over the K taps, ∂w over every (b, i, c); the size of their terms
        "y": (35, 35 * big(x) * big(conv.weight) + big(base)), "x": (35, 35 * big(upstream) * big(conv.weight)),
        "weight": (2 * n * d, 2 * n * d * big(upstream) * big(x)), "base": (1, big(upstream))}
    for name, got, expected in zip(terms, *results):
        length, scale = terms[name]
        torch.testing.assert_close(got, expected, **tolerance(dtype, length, scale=scale), msg=name)
    masked_only = conv(x * ~mask[:, None, :, None], mask, None)  # only pad rows of x: the conv sees zeros
    assert (masked_only == 0).all()


def test_without_a_compiler_the_conv_warns_and_runs_the_banded_products(monkeypatch):
    def no_compiler(*args, **kwargs):
        raise RuntimeError("the CPU kernels compile on first use (seqconv/cpu.cpp), but the C++ compiler 'c++' "
                           "was not found on PATH")

    monkeypatch.setattr(build, "build", no_compiler)
    seqconv.library.cache_clear()
    try:
        conv = SequenceConv(2, 5).double()
        x = torch.randn(1, 2, 9, 4, dtype=torch.float64)
        with pytest.warns(UserWarning, match="banded matrix products: .*compiler 'c\\+\\+' was not found"):
            assert not seqconv.uses_kernel(x)
        expected = F.conv1d(x.permute(0, 3, 1, 2).reshape(4, 2, 9), conv.weight, padding=2, groups=2)
        torch.testing.assert_close(conv(x), expected.view(1, 4, 2, 9).permute(0, 2, 3, 1), atol=1e-12, rtol=0)
    finally:
        seqconv.library.cache_clear()


def test_no_grad_forward_equals_the_recorded_one_and_base_is_kept_unless_it_is_scratch():
    """Without autograd the conv writes its sum into Nyström's scratch attention term; values are the same as with
    autograd, and a ``base`` the caller keeps (``overwrite_base`` false) is left as it was."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 50, 2, 32, generator=generator).transpose(1, 2) for _ in range(3))
    mask = padded_mask(2, 50, [50, 31])
    attn = NystromAttention(num_heads=2, head_dim=32, num_landmarks=8)
    recorded = attn(*(x.clone().requires_grad_() for x in (q, k, v)), mask)
    with torch.no_grad():
        assert torch.equal(attn(q, k, v, mask), recorded.detach())
        base = torch.randn(2, 2, 50, 32, generator=generator)
        kept = base.clone()
        summed = attn.conv(v, mask, base)
        assert torch.equal(base, kept) and not torch.equal(summed, base)
        assert torch.equal(attn.conv(v, mask, base, overwrite_base=True), summed)
