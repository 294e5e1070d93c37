"""`kernels.cur.cpu`: CUR's training path on the CPU kernels as one autograd node (softmax and L1 scores), against
the float64 plain PyTorch CUR of `kernels.cur.naive` and as close to it as the unfused float32 path (values and
gradients), and the few-keys backward's ``zero_rows``."""

from __future__ import annotations

import functools

import pytest
import torch

from attention.cur import cur_attention
from attention.pinv import iterative_pinv
from attention.scores import L1Score, SoftmaxScore
from attention.selection import select_indices
from kernels.cur import naive
from kernels.landmark_attention import cpu as landmarks_cpu
from tests.attention_reference import padded_mask

WIDTH = landmarks_cpu.vector_floats()
D = 2 * WIDTH  # the head size of the kernels' register tiles on this CPU (32 on AVX-512, 16 on AVX2)

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def operands(n: int, seed: int = 0):
    """q, k, v ``(2, 2, n, D)`` in the (B, n, H, d) memory of the model's projections."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(2, n, 2, D, generator=generator).transpose(1, 2) * 1.5 for _ in range(3)]


def cur_and_grads(q, k, v, mask, index_q, index_k, grad, dtype, overwrite, score, reference=False):
    """CUR's output (``reference``: :func:`kernels.cur.naive.cur_attention`'s) and the gradients of
    ``Σ grad · Y`` over real rows, in ``dtype``, and the output's node."""
    inputs = [x.to(dtype).detach().requires_grad_() for x in (q, k, v)]
    if reference:
        pinv = functools.partial(iterative_pinv, n_iter=6, init="per_head")  # cur_attention's defaults
        y = naive.cur_attention(*inputs, mask, index_q, index_k, score, pinv, overwrite_rows=overwrite)
    else:
        y = cur_attention(*inputs, mask, index_q, index_k, score, overwrite_rows=overwrite)
    (y * grad.to(dtype) * mask[:, None, :, None]).sum().backward()
    return [y.detach().double()] + [x.grad.double() for x in inputs], type(y.grad_fn).__name__


# float32's distance to float64: L1's U is worse conditioned here (outputs up to ~14 from values of scale 1.5), so its
# dQ is 1.4e-5 of the largest entry off in either float32 path, where softmax stays below 1e-5.
@pytest.mark.parametrize(("score", "bound"), [(SoftmaxScore(), 1e-5), (L1Score(1.5), 5e-5)], ids=["softmax", "l1"])
@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite rows", "no overwrite"])
@pytest.mark.parametrize("lengths", [(300, 300), (300, 200), (300, 11)], ids=["full", "padded", "n_real < m"])
def test_one_node_matches_float64_cur_as_closely_as_the_unfused_path(overwrite, lengths, score, bound, monkeypatch):
    """The fused node runs (its backward is the node's), and its output and dQ, dK, dV are as close to float64 as
    the unfused float32 path (autograd through the two kernels and the row copies); with n_real < m invalid slots
    (pad positions) are selected too."""
    q, k, v = operands(300)
    mask = padded_mask(2, 300, list(lengths))
    index_q, index_k = select_indices(q, k, mask, 16)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    reference, _ = cur_and_grads(q, k, v, mask, index_q, index_k, grad, torch.float64, overwrite, score, True)
    fused, node = cur_and_grads(q, k, v, mask, index_q, index_k, grad, torch.float32, overwrite, score)
    assert node == "CURKernelAttentionBackward"
    monkeypatch.setattr("kernels.cur.cpu.takes", lambda *args: False)
    unfused, node = cur_and_grads(q, k, v, mask, index_q, index_k, grad, torch.float32, overwrite, score)
    assert node != "CURKernelAttentionBackward"
    for name, ours, plain, exact in zip(["Y", "dQ", "dK", "dV"], fused, unfused, reference):
        ours_error, plain_error = (ours - exact).abs().max().item(), (plain - exact).abs().max().item()
        assert ours_error <= max(2 * plain_error, 1e-6 * exact.abs().max().item()), (name, ours_error, plain_error)
        assert plain_error < bound * exact.abs().max().item(), (name, plain_error)  # the comparison means something


def test_few_keys_backward_zero_rows_read_the_gradient_rows_as_zero():
    """``zero_rows`` gives bit for bit the gradients of a ``dY`` whose rows are zeroed (the same arithmetic)."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 70, 2, D, generator=generator).transpose(1, 2)
    k, v = torch.randn(2, 2, 2, 9, D, generator=generator)
    bias = landmarks_cpu.key_bias(None, 2, 2, 9, q)
    y, row_max, row_sum = landmarks_cpu.few_keys_forward(q, k, v, bias, D**-0.5)
    lse = row_sum.log() + row_max
    grad = torch.randn(q.shape, generator=generator)
    rows = torch.tensor([[[0, 31, 32, 69], [5, 6, 7, 8]], [[40, 2, 64, 63], [1, 33, 34, 35]]])
    zeroed = grad.scatter(2, rows[..., None].expand(2, 2, 4, D), 0.0)
    expected = landmarks_cpu.few_keys_backward(zeroed, q, k, v, bias, y, lse, D**-0.5)
    got = landmarks_cpu.few_keys_backward(grad, q, k, v, bias, y, lse, D**-0.5, zero_rows=rows)
    for name, ours, theirs in zip("QKV", got, expected):
        assert torch.equal(ours, theirs), f"d{name}"
    assert got[0].gather(2, rows[..., None].expand(2, 2, 4, D)).abs().max() == 0
    assert not torch.equal(got[1], landmarks_cpu.few_keys_backward(grad, q, k, v, bias, y, lse, D**-0.5)[1])


def test_few_keys_backward_rejects_a_zero_row_outside_the_sequence():
    q = torch.randn(1, 1, 10, D)
    k = v = torch.randn(1, 1, 3, D)
    bias = landmarks_cpu.key_bias(None, 1, 1, 3, q)
    y, row_max, row_sum = landmarks_cpu.few_keys_forward(q, k, v, bias, 1.0)
    with pytest.raises(ValueError, match=r"zero row outside \[0, 10\)"):
        landmarks_cpu.few_keys_backward(torch.ones_like(q), q, k, v, bias, y, row_max, 1.0,
                                        zero_rows=torch.tensor([[[10]]]))


def test_gradients_come_in_the_memory_layout_of_the_inputs():
    """dQ, dK, dV in the (B, n, H, d) memory of the model's projections, so autograd hands them to the projections
    without a transposing copy each (the strides of the inputs, not contiguous (B, H, n, d))."""
    q, k, v = [x.requires_grad_() for x in operands(300)]
    mask = padded_mask(2, 300, [300, 200])
    index_q, index_k = select_indices(q, k, mask, 16)
    y = cur_attention(q, k, v, mask, index_q, index_k)
    assert type(y.grad_fn).__name__ == "CURKernelAttentionBackward"
    grads = torch.autograd.grad(y.sum(), (q, k, v))
    assert [g.stride() for g in grads] == [x.stride() for x in (q, k, v)] and not q.is_contiguous()


def test_a_retained_graph_runs_backward_twice():
    """``backward(retain_graph=True)`` twice through the node adds the same gradients twice (its m × m middle is
    kept as long as the node)."""
    q, k, v = [x.requires_grad_() for x in operands(100)]
    mask = padded_mask(2, 100, [100, 60])
    index_q, index_k = select_indices(q, k, mask, 8)
    y = cur_attention(q, k, v, mask, index_q, index_k)
    y.square().sum().backward(retain_graph=True)
    once = [x.grad.clone() for x in (q, k, v)]
    y.square().sum().backward()
    for twice, single in zip((q.grad, k.grad, v.grad), once):
        torch.testing.assert_close(twice, 2 * single)
