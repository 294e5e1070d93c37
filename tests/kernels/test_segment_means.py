"""Nyströmformer's landmark kernels (:mod:`kernels.segment_means`): against their plain reference
(:mod:`kernels.segment_means.naive`) and the CPU forms, and compiled for GPUs.

The kernel tests need the kernels to run: on a CUDA GPU, or on CPU with ``TRITON_INTERPRET=1`` set before Python
starts. Without either they are skipped here, and ``tests/attention/test_nystrom.py::test_landmark_kernels_under_the_interpreter``
runs this file in a subprocess with the variable set, so the default suite always exercises them. The AOT tests
compile the kernels for sm_80 (A100) and sm_90 (H100) without a GPU (not under the interpreter): every shape the
kernels take within the architecture's shared memory and without register spills; the default suite the
largest tiles on sm_80, ``-m slow`` every tile size on both.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from attention import paths
from attention.impl import configure
from attention.landmark_means import landmark_means
from attention.nystrom import NystromAttention
from kernels.segment_means import launch, naive, ops
from tests import triton_env
from tests.triton_env import DEVICE, INTERPRETER

needs_kernels = triton_env.needs_kernels("test_nystrom.py::test_landmark_kernels_under_the_interpreter")
compiles = pytest.mark.skipif(INTERPRETER, reason="kernels defined under the interpreter cannot be compiled for a GPU")


# Programs the forward aims for in the tests of values (two or three groups of segments per sequence at B·H = 10, where
# two GPU waves would make 80–320 programs, each run one by one by the interpreter); the grid over groups has its own
# test (test_segment_groups_partition_the_tokens, up to one segment a program).
FEW_PROGRAMS = 20


def masks(n: int) -> torch.Tensor:
    """Full; padded at the end; pads inside and before the first real token; fewer real tokens than segments; none."""
    mask = torch.ones(5, n, dtype=torch.bool)
    mask[1, n - 9:] = False
    mask[2, :3] = mask[2, 10:14] = False
    mask[3, 4:] = False
    mask[4] = False
    return mask


@needs_kernels
@pytest.mark.parametrize("n, d, m", [(37, 20, 7), (100, 32, 16), (64, 8, 64)])
def test_kernel_landmarks_equal_the_cpu_forms(monkeypatch, n, d, m):
    """Means, the slot mask and validity, and the gradients of Q and K, against :func:`kernels.segment_means.naive.segment_means`
    (a few groups of segments a sequence: :data:`FEW_PROGRAMS`)."""
    monkeypatch.setattr(launch, "TARGET_PROGRAMS", FEW_PROGRAMS)
    generator = torch.Generator().manual_seed(n)
    q, k = (torch.randn(5, 2, n, d, generator=generator) for _ in range(2))
    q[3, :, 5] = torch.nan  # a pad's value never reaches the means (sequence 3 pads position 5)
    mask = masks(n)
    upstream = [torch.randn(5, 2, m, d, generator=generator) for _ in range(2)]
    expected, grads = [], []
    for x, g in zip((q, k), upstream):
        leaf = x.clone().requires_grad_()
        means, valid = naive.segment_means(leaf, mask, m)
        grads.append(torch.autograd.grad(means, leaf, g * valid[:, None, :, None])[0].nan_to_num())
        expected.append(torch.where(valid[:, None, :, None], means, 0.0))
    q_dev, k_dev = (x.to(DEVICE).requires_grad_() for x in (q, k))
    assert ops.takes(q_dev, k_dev, m)  # landmark_means takes the kernels, not the SDPA form
    q_land, k_land, slots, kernel_valid = landmark_means(q_dev, k_dev, mask.to(DEVICE), m)
    assert torch.equal(kernel_valid.cpu(), valid[:, None].expand(5, 2, m))
    assert torch.equal(slots[:, :, 0].cpu(), paths.masking_bias(valid, torch.float32)[:, None].expand(5, 2, m))
    for got, want in zip((q_land, k_land), expected):
        torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
    got_grads = torch.autograd.grad((q_land, k_land), (q_dev, k_dev), [g.to(DEVICE) for g in upstream])
    for got, want in zip(got_grads, grads):
        torch.testing.assert_close(got.cpu().masked_fill(~mask[:, None, :, None], 0.0), want, atol=1e-6, rtol=1e-5)
        assert (got.cpu()[~mask[:, None, :].expand(5, 2, n)] == 0).all()  # pads get no gradient


@needs_kernels
def test_bf16_inputs_give_float32_means_and_bf16_gradients(monkeypatch):
    """bf16 ``q, k``: the means (float32, m-sized) of the bf16 values exactly as the float32 kernels give them
    (float32 sums), the token gradients in bf16 (n-sized: ``dX̃ / count`` rounded once to bf16's 8 significant bits:
    ≤ 2⁻⁸ relative rounded to nearest, ≤ 2⁻⁷ truncated, as the interpreter's conversion may)."""
    monkeypatch.setattr(launch, "TARGET_PROGRAMS", FEW_PROGRAMS)
    n, d, m = 50, 16, 8
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(5, 2, n, d, generator=generator).bfloat16() for _ in range(2))
    mask = masks(n)
    leaves = [x.to(DEVICE).requires_grad_() for x in (q, k)]
    assert launch.takes(leaves[0], m)
    q_land, k_land, _, valid = landmark_means(*leaves, mask.to(DEVICE), m)
    assert q_land.dtype == k_land.dtype == torch.float32
    upstream = [torch.randn(5, 2, m, d, generator=generator) for _ in range(2)]
    grads = torch.autograd.grad((q_land, k_land), leaves, [g.to(DEVICE) for g in upstream])
    assert all(g.dtype == torch.bfloat16 for g in grads)
    for x, got_mean, got_grad, g in zip((q, k), (q_land, k_land), grads, upstream):
        leaf = x.float().requires_grad_()
        means, want_valid = naive.segment_means(leaf, mask, m)
        torch.testing.assert_close(got_mean.cpu(), torch.where(want_valid[:, None, :, None], means, 0.0).detach(),
                                   atol=1e-6, rtol=1e-6)
        want = torch.autograd.grad(means, leaf, g * want_valid[:, None, :, None])[0].nan_to_num()
        want = want.masked_fill(~mask[:, None, :, None], 0.0)
        torch.testing.assert_close(got_grad.cpu().float(), want, atol=1e-6, rtol=2.0**-7)


@needs_kernels
@pytest.mark.parametrize("m, target, groups", [(16, 1, 1), (16, 40, 4), (7, 20, 3), (16, 264, 16)])
def test_segment_groups_partition_the_tokens(monkeypatch, m, target, groups):
    """The forward's grid over groups of segments (``launch.segments_per_program``: all m in one program, 4 of 4,
    3 + 3 + 1, one each) gives the reference's means, validity and each token's segment, whatever the pads (before
    the first real token, inside, at the end, more segments than real tokens, none)."""
    monkeypatch.setattr(launch, "TARGET_PROGRAMS", target)
    n, d = 70, 16
    assert -(-m // launch.segments_per_program(10, m, d, target)) == groups
    generator = torch.Generator().manual_seed(m + target)
    q, k = (torch.randn(5, 2, n, d, generator=generator) for _ in range(2))
    mask = masks(n)
    q_land, k_land, counts, slots, valid, segment = launch.segment_means_forward(
        q.to(DEVICE), k.to(DEVICE), mask.to(DEVICE), m, paths.MASKED)
    assert torch.equal(segment.cpu(), naive.segments(mask, m)[:, None].expand(5, 2, n).int())
    for got, x in zip((q_land, k_land), (q, k)):
        means, want_valid = naive.segment_means(x, mask, m)
        assert torch.equal(valid.cpu(), want_valid[:, None].expand(5, 2, m))
        torch.testing.assert_close(got.cpu(), torch.where(want_valid[:, None, :, None], means, 0.0), atol=1e-5, rtol=1e-5)


@needs_kernels
def test_fused_nystrom_with_the_kernels_equals_the_cpu_forms(monkeypatch):
    """The whole fused Nyström (landmarks by the kernels) against the CPU forms: output and every gradient."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 40, 2, 16, generator=generator).transpose(1, 2) for _ in range(3))
    mask = masks(40)[1:3]
    attn = NystromAttention(2, 16, num_landmarks=8, conv_kernel_size=5)
    upstream = torch.randn(2, 2, 40, 16, generator=generator)
    results = []
    for form, device in (("cpu", "cpu"), ("fused", DEVICE)):
        inputs = [x.to(device).requires_grad_() for x in (q, k, v)]
        module = configure(attn, form, "nystromformer").to(device)
        y = module(*inputs, mask.to(device))
        grads = torch.autograd.grad(y, [*inputs, module.conv.weight], upstream.to(device))
        results.append([t.cpu() for t in (y, *grads)])
    for name, got, want in zip(("y", "q", "k", "v", "conv"), results[1], results[0]):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4, msg=name)


SHAPES = [(m, d) for m, d in itertools.product((16, 32, 64, 128), (16, 32, 64, 128))
          if launch.tiles(m, d)[0] * launch.tiles(m, d)[1] <= launch.MAX_TILE]
FAST = ([(kernel, 80, 128, 64, torch.float32) for kernel in launch.KERNELS]
        + [("_segment_means_fwd", 80, 64, 128, torch.float32), ("_segment_means_fwd", 90, 64, 128, torch.bfloat16),
           ("_segment_means_bwd", 90, 128, 64, torch.bfloat16)])


def compile_case(kernel: str, capability: int, m: int, d: int, dtype: torch.dtype = torch.float32):
    """``kernel`` compiled for ``sm_<capability>`` with its largest tiles (one program for all m segments)."""
    from kernels.common import aot

    fn = launch.kernel_function(kernel)
    return aot.compile_jit(fn, capability, launch.launch_config(kernel, m, d), launch.pointer_types(kernel, dtype),
                           launch.FLOAT_ARGS)


@compiles
@pytest.mark.parametrize("kernel, capability, m, d, dtype", FAST, ids=str)
def test_largest_tiles_compile_without_spills(kernel, capability, m, d, dtype):
    compiled = compile_case(kernel, capability, m, d, dtype)
    assert compiled.fits, compiled


@compiles
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("capability", [80, 90])
@pytest.mark.parametrize("kernel", launch.KERNELS)
def test_every_tile_compiles_without_spills(kernel, capability, dtype):
    failures = [compiled for m, d in SHAPES if not (compiled := compile_case(kernel, capability, m, d, dtype)).fits]
    assert not failures, failures
