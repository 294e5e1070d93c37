"""Selection rules (CUR paper §7.1): each picks what its definition says, never a pad, ties lowest index.

Most tests run twice (``landmark_forms``): the CPU forms give the indices ascending, the fused forms of other devices
in priority order, so the tests compare :func:`ascending` indices where the order is not what they check.
"""

import pytest
import torch

from kernels.selection import cpu as selection_cpu
from attention.selection import _top, select_indices
from tests.attention_reference import padded_mask

pytestmark = [pytest.mark.usefixtures("landmark_forms"), pytest.mark.numerics]  # numerics: make test-numerics reruns it


def ascending(index: torch.Tensor) -> torch.Tensor:
    return index.sort(-1).values


def constructed(n=12, d=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, n, d, generator=generator)
    k = torch.randn(1, 2, n, d, generator=generator)
    return q, k


def expected_top(values, m):
    """Indices of the m largest values (plain Python, ties by lowest index), ascending."""
    ranked = sorted(range(len(values)), key=lambda i: (-values[i], i))
    return sorted(ranked[:m])


@pytest.mark.parametrize(
    "rule, row_priority",
    [
        ("sum", lambda x: x.sum(-1)),
        ("abs", lambda x: x.abs().sum(-1)),
        ("embed", lambda x: x[..., 2]),
    ],
)
def test_top_m_rules_same_and_separate(rule, row_priority):
    q, k = constructed()
    mask = torch.ones(1, 12, dtype=torch.bool)
    index_q, index_k = select_indices(q, k, mask, 5, rule, same_indices=True, embed_column=2)
    for head in range(2):
        both = (row_priority(q[0, head]) + row_priority(k[0, head])).tolist()
        assert ascending(index_q)[0, head].tolist() == expected_top(both, 5) == ascending(index_k)[0, head].tolist()
    index_q, index_k = select_indices(q, k, mask, 5, rule, same_indices=False, embed_column=2)
    for head in range(2):
        assert ascending(index_q)[0, head].tolist() == expected_top(row_priority(q[0, head]).tolist(), 5)
        assert ascending(index_k)[0, head].tolist() == expected_top(row_priority(k[0, head]).tolist(), 5)


def test_abs_picks_rows_of_largest_absolute_sum_not_signed_sum():
    q = torch.zeros(1, 1, 6, 2)
    q[0, 0, 1] = torch.tensor([-5.0, -5.0])  # |.|-sum 10, signed sum -10
    q[0, 0, 4] = torch.tensor([3.0, 0.0])
    index_abs, _ = select_indices(q, torch.zeros_like(q), None, 2, "abs")
    index_sum, _ = select_indices(q, torch.zeros_like(q), None, 2, "sum")
    assert ascending(index_abs)[0, 0].tolist() == [1, 4]
    assert 1 not in index_sum[0, 0].tolist() and 4 in index_sum[0, 0].tolist()


def test_ties_break_by_lowest_index():
    q = torch.ones(1, 1, 10, 3)
    index, _ = select_indices(q, q, None, 4, "abs")
    assert index[0, 0].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("kernel", [True, False], ids=["cpu_kernel", "pytorch"])
@pytest.mark.parametrize("force_cls", [False, True])
def test_top_m_is_what_a_stable_descending_sort_ranks_first(force_cls, kernel, monkeypatch):
    """Integer priorities (many ties), pads, fewer real tokens than m: the m winners of a stable sort, by the CPU
    kernel (kernels.selection.top_indices) and by the PyTorch form of other devices."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randint(-2, 3, (3, 2, 50, 1), generator=generator).float()  # 'sum' priority = the value
    mask = padded_mask(3, 50, [50, 31, 5])
    priority = q[..., 0].masked_fill(~mask[:, None, :], float("-inf"))
    if force_cls:
        priority[..., 0] = float("inf")
    for m in (1, 7, 31, 50):
        index, _ = select_indices(q, torch.zeros_like(q), mask, m, "sum", force_cls=force_cls,
                                  form="cpu" if kernel else "pytorch")
        ranked = torch.sort(priority, dim=-1, descending=True, stable=True).indices[..., :m]
        assert torch.equal(ascending(index), ranked.sort(dim=-1).values), m


def test_top_m_kernel_equals_the_pytorch_form_with_nan_and_infinite_priorities(landmark_forms, monkeypatch):
    """NaN ranks as +inf, ±inf and ties among them break by the lowest index, a masked NaN is padding: the kernel
    and the PyTorch form pick the same indices (the CPU forms; the fused forms' NaN: the next test)."""
    if landmark_forms == "fused_forms":
        pytest.skip("compares the CPU kernel with the CPU forms' PyTorch code")
    generator = torch.Generator().manual_seed(1)
    priority = torch.randint(-3, 4, (3, 2, 40), generator=generator).float()
    special = torch.rand(priority.shape, generator=generator)
    priority[special < 0.1] = float("nan")
    priority[(special >= 0.1) & (special < 0.15)] = float("inf")
    priority[(special >= 0.15) & (special < 0.2)] = float("-inf")
    mask = padded_mask(3, 40, [40, 23, 3])
    for force_cls in (False, True):
        for m in (1, 5, 23, 40):
            kernel = selection_cpu.top_indices(priority, mask, m, force_cls)
            assert kernel is not None  # the kernel takes these priorities
            assert torch.equal(kernel, _top(priority.clone(), mask, m, force_cls, "pytorch")), (m, force_cls)


def test_fused_top_ranks_nan_first_and_otherwise_as_the_cpu_forms(monkeypatch):
    """The fused forms' stable sort ranks NaN above +inf (the CPU forms tie them), everything else alike; with
    ``force_cls`` index 0 still comes first, NaN priorities or not."""
    generator = torch.Generator().manual_seed(1)
    priority = torch.randint(-3, 4, (3, 2, 40), generator=generator).float()
    special = torch.rand(priority.shape, generator=generator)
    priority[special < 0.1] = float("inf")
    priority[(special >= 0.1) & (special < 0.15)] = float("-inf")
    mask = padded_mask(3, 40, [40, 23, 3])
    cpu = {m: _top(priority.clone(), mask, m, False, "cpu") for m in (1, 5, 23, 40)}
    for m, expected in cpu.items():
        assert torch.equal(ascending(_top(priority.clone(), mask, m, False, "fused")), expected), m
    with_nan = priority.clone()
    with_nan[:, :, 2] = float("nan")
    top = _top(with_nan, mask, 2, force_cls=True, form="fused")
    assert (top[..., 0] == 0).all() and (top[..., 1] == 2).all()  # index 0 forced, then NaN above every +inf


def test_step_is_uniform_stride_over_real_tokens():
    q, k = constructed(n=40)
    mask = padded_mask(2, 40, [40, 22])
    q, k = q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1)
    index, _ = select_indices(q, k, mask, 8, "step")
    assert index[0, 0].tolist() == [j * 40 // 8 for j in range(8)]
    assert index[1, 1].tolist() == [j * 22 // 8 for j in range(8)]
    # real tokens need not be a prefix: the stride runs over their ranks
    holes = torch.ones(1, 40, dtype=torch.bool)
    holes[0, ::2] = False
    index, _ = select_indices(q[:1], k[:1], holes, 4, "step")
    real = [i for i in range(40) if i % 2]
    assert index[0, 0].tolist() == [real[j * 20 // 4] for j in range(4)]


@pytest.mark.parametrize("rule", ["sum", "abs", "embed", "step", "random"])
@pytest.mark.parametrize("same", [True, False])
def test_no_pad_is_selected_and_indices_are_distinct(rule, same):
    q, k = constructed(n=30, seed=3)
    q, k = q.expand(3, -1, -1, -1) * 1.0, k.expand(3, -1, -1, -1) * 1.0
    q[:, :, 20:] += 100.0  # pads with the largest priorities of every value rule
    k[:, :, 20:] += 100.0
    mask = padded_mask(3, 30, [20, 13, 9])
    index_q, index_k = select_indices(q, k, mask, 8, rule, same_indices=same)
    for index in (index_q, index_k):
        assert index.shape == (3, 2, 8)
        for b, length in enumerate([20, 13, 9]):
            for head in range(2):
                chosen = index[b, head].tolist()
                assert len(set(chosen)) == 8 and all(i < length for i in chosen)


@pytest.mark.parametrize("rule", ["sum", "abs", "step", "random"])
def test_fewer_real_tokens_than_m_selects_all_real_then_lowest_pads(rule):
    q, k = constructed(n=16)
    mask = padded_mask(1, 16, [5])
    index_q, index_k = select_indices(q, k, mask, 8, rule, same_indices=False)
    assert ascending(index_q)[0, 0].tolist() == list(range(8)) == ascending(index_k)[0, 1].tolist()


def test_shorter_sequence_than_m_selects_every_position():
    q, k = constructed(n=6)
    index, _ = select_indices(q, k, None, 64, "abs")
    assert index.shape == (1, 2, 6) and ascending(index)[0, 0].tolist() == list(range(6))


@pytest.mark.parametrize("rule", ["sum", "abs", "embed", "step", "random"])
def test_force_cls_includes_index_zero(rule):
    q, k = constructed(n=30, seed=5)
    least = 0.0 if rule == "abs" else -50.0  # the least likely row for this value rule
    q[:, :, 0] = least
    k[:, :, 0] = least
    for force, expect in ((True, True), (False, rule in ("step",))):
        index_q, index_k = select_indices(q, k, None, 4, rule, same_indices=False, force_cls=force)
        if force:
            assert (index_q[..., 0] == 0).all() and (index_k[..., 0] == 0).all()
        elif rule != "random":
            assert ((index_q == 0).any(-1) == expect).all()


def test_random_is_uniform_over_real_tokens_and_reproducible():
    q, k = constructed(n=10)
    mask = padded_mask(1, 10, [6])
    counts = torch.zeros(10)
    generator = torch.Generator().manual_seed(0)
    for _ in range(600):
        index, _ = select_indices(q, k, mask, 3, "random", generator=generator)
        counts.scatter_add_(0, index[0, 0], torch.ones(3))
    assert counts[6:].sum() == 0
    assert torch.allclose(counts[:6] / 600, torch.full((6,), 0.5), atol=0.08)  # each real token: m/n_real
    first = select_indices(q, k, mask, 3, "random", generator=torch.Generator().manual_seed(7))
    second = select_indices(q, k, mask, 3, "random", generator=torch.Generator().manual_seed(7))
    assert torch.equal(first[0], second[0])


def test_unknown_rule_is_a_config_error():
    q, k = constructed()
    with pytest.raises(ValueError, match="attention.selection='topk'.*abs"):
        select_indices(q, k, None, 4, "topk")
