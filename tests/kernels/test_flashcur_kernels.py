"""FlashCUR kernels against their plain reference (:mod:`kernels.cur.naive`) and CUR (same indices).

These tests need the kernels to run: on a CUDA GPU, or on CPU with ``TRITON_INTERPRET=1`` set before
Python starts (the interpreter is chosen when :mod:`kernels.cur` is defined, so it cannot be
switched on inside a shared pytest process). Without either they are skipped here, and
``tests/kernels/test_flashcur.py::test_kernels_under_the_interpreter`` runs this file in a subprocess with
the variable set — so the default suite always exercises them. Shapes are tiny (the interpreter is
~60× slower than torch); the wider sweep is ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from kernels.cur import naive
from tests.triton_env import DEVICE, needs_kernels

pytestmark = [
    needs_kernels("test_flashcur.py::test_kernels_under_the_interpreter"),
    pytest.mark.usefixtures("exact_float32_matmuls"),  # tests/conftest.py: CUR's reference matmuls without TF32
]


def make_inputs(batch, heads, n, d, pad_last: int, seed=0, dtype=torch.float32):
    """Random ``q, k, v`` ``(B, H, n, d)`` (grad-enabled) and a mask with ``pad_last`` pads in the last sequence."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, d, generator=generator).to(DEVICE, dtype).requires_grad_() for _ in range(3))
    key_mask = torch.ones(batch, n, dtype=torch.bool, device=DEVICE)
    key_mask[-1, n - pad_last:] = False
    return q, k, v, key_mask


def test_each_kernel_matches_its_equation():
    """Kernels (a), (b), (c) on their own: RV and its lse, U, and softmax(QK_Jᵀ)W with rows I replaced."""
    from kernels.cur import run

    q, k, v, key_mask = make_inputs(2, 2, 37, 24, pad_last=9)
    index = torch.stack([torch.randperm(28)[:16] for _ in range(4)]).view(2, 2, 16).to(DEVICE)
    rows = lambda x: x.detach().gather(2, index[..., None].expand(-1, -1, -1, x.shape[-1])).contiguous()  # noqa: E731
    q_sel, k_sel = rows(q), rows(k)
    valid = torch.ones(2, 2, 16, dtype=torch.bool, device=DEVICE)
    valid[..., -3:] = False
    rv_ref, lse_ref = naive.rows(q_sel, k.detach(), v.detach(), key_mask)
    rv, lse = run.rv_forward(q_sel, k.detach(), v.detach(), key_mask)
    torch.testing.assert_close(rv, rv_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(run.u_forward(q_sel, k_sel, valid), naive.core(q_sel, k_sel, valid), atol=1e-6, rtol=1e-5)
    w = torch.randn(2, 2, 16, 24, device=DEVICE)
    slot = torch.full((2, 2, 37), -1, dtype=torch.int32, device=DEVICE)
    slot.scatter_(2, index, torch.arange(16, dtype=torch.int32, device=DEVICE).expand(2, 2, 16).contiguous())
    y, _ = run.out_forward(q.detach(), k_sel, valid, w, rv, slot)
    torch.testing.assert_close(y, naive.output(q.detach(), k_sel, valid, w, rv, index), atol=1e-5, rtol=1e-5)


def test_forward_matches_an_independent_dense_reference():
    """n = 37 (not a multiple of the tile), head_dim 24 (masked tile columns), padding, m = 16."""
    from attention.flashcur import flashcur_attention
    from attention.selection import select_indices

    q, k, v, key_mask = make_inputs(2, 2, 37, 24, pad_last=10)
    index_q, index_k = select_indices(q, k, key_mask, 16, "abs", True, 0, False)
    out = flashcur_attention(q, k, v, key_mask, index_q, index_k, pinv_iters=6)
    assert out.shape == q.shape and out.dtype == q.dtype
    ref = naive.dense_cur(q, k, v, key_mask, index_q, pinv_iters=6)
    assert (out.detach().cpu().double() - ref).abs().max() <= 1e-4


CASES = [  # (batch, heads, n, head_dim, m, pad_last, selection, same_indices, overwrite_rows)
    (2, 2, 37, 24, 16, 10, "abs", True, True),
    (1, 2, 50, 32, 32, 7, "sum", False, True),
    (2, 1, 21, 16, 16, 0, "abs", True, False),
    (2, 1, 12, 16, 16, 4, "abs", True, True),  # n < m and n_real < m: CUR = exact attention
]
SLOW_CASES = [
    (2, 2, 130, 64, 64, 33, "abs", True, True),
    (1, 2, 200, 128, 128, 50, "step", True, True),
    (1, 1, 97, 48, 48, 5, "embed", False, True),  # m = 48 padded up to 64
    (2, 2, 70, 80, 32, 0, "random", False, False),
]


def compare_with_cur(batch, heads, n, d, m, pad_last, selection, same, overwrite):
    """Max |Δout| and max relative |Δgrad| (per q, k, v) of FlashCUR vs ``attention.cur.cur_attention``."""
    from attention.cur import cur_attention
    from attention.flashcur import flashcur_attention
    from attention.selection import select_indices

    q, k, v, key_mask = make_inputs(batch, heads, n, d, pad_last)
    generator = torch.Generator(device=DEVICE).manual_seed(1)
    index_q, index_k = select_indices(q, k, key_mask, m, selection, same, 0, False, generator)
    ref = cur_attention(q, k, v, key_mask, index_q, index_k, None, 6, overwrite)
    out = flashcur_attention(q, k, v, key_mask, index_q, index_k, 6, overwrite)
    grad_out = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    rel = [((g - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref_grads)]
    return (out - ref).abs().max().item(), rel


def check_case(case):
    error, grad_errors = compare_with_cur(*case)
    print(f"case {case}: max |Δy| = {error:.2e}, max rel |Δgrad| (q, k, v) = {[f'{e:.2e}' for e in grad_errors]}")
    assert error <= 1e-4
    assert max(grad_errors) <= 1e-3


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"n{c[2]}-d{c[3]}-m{c[4]}-{c[6]}")
def test_forward_and_gradients_match_cur(case):
    check_case(case)


def test_one_split_matches_cur(monkeypatch):
    """The layer with every split kernel on one split (``TARGET_PROGRAMS = 1``: the partial is the result, no merge)."""
    from kernels.cur import launch as kernel_launch

    monkeypatch.setattr(kernel_launch, "TARGET_PROGRAMS", 1)
    check_case(CASES[0])


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES, ids=lambda c: f"n{c[2]}-d{c[3]}-m{c[4]}-{c[6]}")
def test_forward_and_gradients_match_cur_wider(case):
    check_case(case)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_inputs_stay_close_to_float32(dtype):
    """fp16/bf16 q, k, v (fp32 accumulation) against CUR on the same inputs in float32."""
    from attention.cur import cur_attention
    from attention.flashcur import flashcur_attention
    from attention.selection import select_indices

    q, k, v, key_mask = make_inputs(1, 2, 45, 32, pad_last=6)
    index_q, index_k = select_indices(q, k, key_mask, 16, "abs", True, 0, False)
    ref = cur_attention(q, k, v, key_mask, index_q, index_k, None, 6, True)
    out = flashcur_attention(*(x.detach().to(dtype) for x in (q, k, v)), key_mask, index_q, index_k, 6, True)
    assert out.dtype == dtype
    error = (out.float() - ref).abs().max().item()
    print(f"{dtype}: max |Δy| vs float32 CUR = {error:.2e}")
    assert error <= (2e-2 if dtype == torch.float16 else 6e-2)


def test_backward_saves_no_n_by_m_tensor():
    """Bytes FlashCUR saves for backward beyond q, k, v and its output (saved-tensor hook), per (sequence, head):
    O(n) log-sum-exps and row slots plus m×d, m×m tensors, under half of one float32 n×m matrix (what CUR's forms
    save is theirs). The output is saved, as flash attention saves it (``Δ_C`` is read off it), and is what the
    layer's next product keeps anyway."""
    from attention.flashcur import flashcur_attention
    from attention.selection import select_indices

    batch, heads, n, d, m = 1, 2, 512, 16, 16
    q, k, v, key_mask = make_inputs(batch, heads, n, d, pad_last=0)
    index_q, index_k = select_indices(q, k, key_mask, m, "abs", True, 0, False)
    inputs = {x.untyped_storage().data_ptr() for x in (q, k, v)}
    seen: dict[int, tuple[int, tuple]] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = flashcur_attention(q, k, v, key_mask, index_q, index_k, 6, True)
    assert out.untyped_storage().data_ptr() in seen
    saved = {ptr: entry for ptr, entry in seen.items() if ptr not in inputs | {out.untyped_storage().data_ptr()}}
    flash = sum(size for size, _ in saved.values()) // (batch * heads)
    print(f"FlashCUR saves {flash} B per head beyond q, k, v (n={n}, d={d}, m={m}): {sorted(saved.values())}")
    assert not any(n in shape and m in shape for _, shape in saved.values())  # no n × m tensor
    assert flash < n * m * 4 / 2


# ---- split n (kernels.cur.launch.splits) and bf16 inputs ------------------------------------------------------


@pytest.mark.parametrize("target", [1, 3, 264], ids=lambda t: f"target{t}")
def test_split_kernels_match_their_equations(monkeypatch, target):
    """The split kernels (_rv_fwd, _rv_bwd_q, _out_bwd_kw) and their merges against float64 autograd at n = 100
    (32-token tiles: splits of 32 or 64 tokens, the last one short), pads inside a split and a split without a
    real key (merged with weight 0): ``target`` programs 1 (one split), 3, 264 (one split per tile)."""
    from kernels.cur import launch as flashcur
    from kernels.cur import run

    monkeypatch.setattr(flashcur, "TARGET_PROGRAMS", target)
    batch, heads, n, d, m = 2, 1, 100, 24, 16
    q, k, v, key_mask = make_inputs(batch, heads, n, d, pad_last=40)  # keys 60..99 of sequence 1: split 96..99 empty
    cfg = flashcur.config("_rv_fwd", n, m, d, q)
    parts, split_n = run._split("_rv_fwd", cfg, batch * heads, n, m)
    assert parts == {1: 1, 3: 2, 264: 4}[target] and n % split_n != 0, (parts, split_n)
    index = torch.stack([torch.randperm(60)[:m] for _ in range(batch * heads)]).view(batch, heads, m).to(DEVICE)
    rows = lambda x: x.detach().gather(2, index[..., None].expand(-1, -1, -1, d)).contiguous()  # noqa: E731
    q_sel, k_sel = rows(q), rows(k)
    q64, k64, v64, q_sel64 = (x.detach().double().requires_grad_() for x in (q, k, v, q_sel))
    rv_ref, lse_ref = naive.rows(q_sel64, k64, v64, key_mask)
    rv, lse = run.rv_forward(q_sel, k.detach(), v.detach(), key_mask)
    torch.testing.assert_close(rv.double(), rv_ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), lse_ref.detach(), atol=1e-5, rtol=1e-5)
    d_rv = torch.randn(rv.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    dq_sel, dk, dv = run.rv_backward(q_sel, k.detach(), v.detach(), key_mask, rv, lse, d_rv)
    expected = torch.autograd.grad(rv_ref, (q_sel64, k64, v64), d_rv.double())
    for got, want in zip((dq_sel, dk, dv), expected):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)
    # kernel (c)'s backward: dK_J and dW summed over the query splits
    valid = torch.ones(batch, heads, m, dtype=torch.bool, device=DEVICE)
    valid[..., -2:] = False
    w = torch.randn(batch, heads, m, d, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    slot = torch.full((batch, heads, n), -1, dtype=torch.int32, device=DEVICE)
    slot.scatter_(2, index, torch.arange(m, dtype=torch.int32, device=DEVICE).expand(batch, heads, m).contiguous())
    y, lse_c = run.out_forward(q.detach(), k_sel, valid, w, rv, slot)
    d_y = torch.randn(y.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    dq, dk_sel, dw = run.out_backward(q.detach(), k_sel, valid, w, slot, y, lse_c, d_y)
    k_sel64, w64 = k_sel.double().requires_grad_(), w.double().requires_grad_()
    free = (slot < 0)[..., None].double()  # rows I were overwritten by RV: no gradient through C W
    expected = torch.autograd.grad(naive.columns_times(q64, k_sel64, valid, w64), (q64, k_sel64, w64), d_y.double() * free)
    for got, want in zip((dq, dk_sel, dw), expected):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)


def test_bf16_inputs_against_float64():
    """bf16 q, k, v (F32_DOT under the interpreter; on a GPU bf16 tensor-core operands): the output and the
    gradients, all bf16 (no float32 n × d result), against CUR in float64 on the same (bf16-rounded) inputs.

    Tolerance from the dtype: bf16 keeps 8 significant bits, unit roundoff u = 2⁻⁸; the output and each
    gradient are rounded once to bf16 (≤ u relative), and on a GPU the dot operands (probabilities, W, dRV, dS)
    are rounded once each, a few u summed over convex weights: 4u of the largest entry for Y, 8u for the
    gradients (their accumulation over the m slots and the gradient paths adds a few more roundings)."""
    from attention.cur import cur_attention
    from attention.flashcur import flashcur_attention
    from attention.selection import select_indices

    u = 2.0**-8
    q, k, v, key_mask = make_inputs(2, 2, 70, 32, pad_last=20, dtype=torch.bfloat16)
    index_q, index_k = select_indices(q, k, key_mask, 16, "abs", True, 0, False)
    out = flashcur_attention(q, k, v, key_mask, index_q, index_k, 6, True)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE, torch.bfloat16)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in grads)
    exact = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = cur_attention(*exact, key_mask, index_q, index_k, None, 6, True)
    ref_grads = torch.autograd.grad(ref, exact, grad_out.double())
    error = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    grad_errors = [((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref_grads)]
    print(f"bf16: max |Δy| / max |y| = {error:.2e} (≤ {4 * u:.1e}), gradients {[f'{e:.2e}' for e in grad_errors]} "
          f"(≤ {8 * u:.1e})")
    assert error <= 4 * u
    assert max(grad_errors) <= 8 * u


# ---- kernel (a) as the fused CUR and Nyström forms' rows stage (attention.impl's Forms.rows) -------------------


@pytest.mark.parametrize("m", [16, 5, 20], ids=lambda m: f"m{m}")  # a kernel size; padded to 16; padded to 32
def test_rows_stage_by_kernel_a_is_the_dense_masked_softmax(m):
    """``landmark_stages.rows_attention(..., "triton")``: ``R V`` and its gradients against float64 dense softmax
    (n 37, head dim 24, pads in the last sequence), ``m`` rows padded with zero rows to the kernels' size and cut
    off; the kernel ran (its FLOP formula counted), and where it cannot take the rows (m 200) the split-K stage
    runs instead."""
    from torch.utils.flop_counter import FlopCounterMode

    from attention import impl, landmark_stages

    assert impl.resolve("cur", "fused", DEVICE, torch.float32).rows == "triton"
    assert impl.resolve("nystrom", "fused", DEVICE, torch.float32).rows == "triton"
    q, k, v, key_mask = make_inputs(2, 2, 37, 24, pad_last=9, seed=3)
    q_rows = (q.detach()[:, :, :m] * 2).requires_grad_()  # sharper rows than the tokens' own
    with FlopCounterMode(display=False) as counter:
        rv = landmark_stages.rows_attention(q_rows, k, v, key_mask, "triton")
    assert torch.ops.lra_flashcur.rv_forward in counter.get_flop_counts()["Global"]
    assert rv.shape == (2, 2, m, 24) and rv.dtype == torch.float32
    leaves64 = [x.detach().double().requires_grad_() for x in (q_rows, k, v)]
    scores = (leaves64[0] @ leaves64[1].mT / 24**0.5).masked_fill(~key_mask[:, None, None, :], -torch.inf)
    ref = torch.softmax(scores, -1) @ leaves64[2]
    torch.testing.assert_close(rv.double(), ref, atol=1e-5, rtol=1e-5)
    probe = torch.randn(ref.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64).to(DEVICE)
    grads = torch.autograd.grad((rv.double() * probe).sum(), (q_rows, k, v))
    for grad, expected in zip(grads, torch.autograd.grad((ref * probe).sum(), leaves64)):
        torch.testing.assert_close(grad.double(), expected, atol=1e-4 * expected.abs().max().item(), rtol=1e-4)
    assert grads[1][1, :, -9:].abs().max() == 0 and grads[2][1, :, -9:].abs().max() == 0  # pads get nothing

    wide = torch.randn(1, 1, 200, 24, device=DEVICE)
    with FlopCounterMode(display=False) as counter:
        landmark_stages.rows_attention(wide, k[:1, :1].detach(), v[:1, :1].detach(), key_mask[:1], "triton")
    assert torch.ops.lra_flashcur.rv_forward not in counter.get_flop_counts()["Global"]
