"""CUR attention (François et al. 2025, Alg. 1) against dense attention written in the test."""

import pytest
import torch

from attention.cur import CURAttention, cur_attention
from attention.scores import L1Score, SoftmaxScore
from attention.selection import select_indices
from lra.build import build_attention
from tests.attention_reference import (
    assert_padding_invariant,
    bf16_training_step,
    dense_l1_weights,
    dense_softmax_weights,
    low_and_full_rank_qk,
    max_real_error,
    padded_mask,
    random_qkv,
)
from tests.conftest import compose_config

pytestmark = [pytest.mark.usefixtures("landmark_forms"), pytest.mark.numerics]  # numerics: make test-numerics reruns it
N = 40
CASES = [  # (overwrite_rows, pinv_iters)
    (True, 6),  # exact by the overwrite: every real row is in I
    (False, 30),  # exact only if C U⁺ R is: the pseudo-inverse path
]


def cur(score=None, **options):
    return CURAttention(num_heads=2, head_dim=8, score=score, **options)


# float32 through the pseudo-inverse is exact only up to cond(U)·eps: across seeds the error of the
# overwrite=false path ranges 1e-5..8e-4 on these 40×40 matrices, so float32 uses a well-conditioned seed.
@pytest.mark.parametrize("dtype, tol, seed", [(torch.float64, 1e-5, 0), (torch.float64, 1e-5, 1), (torch.float32, 1e-4, 2)])
@pytest.mark.parametrize("overwrite, iters", CASES)
@pytest.mark.parametrize(
    "score, dense", [(None, dense_softmax_weights), (L1Score, dense_l1_weights)], ids=["softmax", "l1"]
)
def test_equals_exact_attention_when_m_covers_real_tokens(dtype, tol, seed, overwrite, iters, score, dense):
    q, k, v = random_qkv(n=N, d=8, dtype=dtype, seed=seed)
    for mask in (padded_mask(2, N, [N, N]), padded_mask(2, N, [N, 23])):
        ref = dense(q.double(), k.double(), mask) @ v.double()
        for m in (N, 64):
            y = cur(score, num_landmarks=m, overwrite_rows=overwrite, pinv_iters=iters)(q, k, v, mask)
            assert y.dtype == dtype
            error = max_real_error(y.double(), ref, mask)
            assert error <= tol, f"m={m} overwrite={overwrite} iters={iters}: max error {error}"


def test_few_pinv_iterations_leave_a_visible_error():
    """The same check with 6 iterations and no overwrite fails: the exactness above is the pinv's."""
    q, k, v = random_qkv(n=N, d=8)
    mask = padded_mask(2, N, [N, N])
    y = cur(num_landmarks=N, overwrite_rows=False, pinv_iters=6)(q, k, v, mask)
    assert max_real_error(y, dense_softmax_weights(q, k, mask) @ v, mask) > 1e-3


def test_low_rank_inputs_are_approximated_far_better_than_full_rank():
    (q_low, k_low), (q_full, k_full) = low_and_full_rank_qk()
    v = random_qkv(n=256, d=16)[2]
    mask = padded_mask(2, 256, [256, 200])
    errors = {}
    for name, (q, k) in {"low": (q_low, k_low), "full": (q_full, k_full)}.items():
        attn = CURAttention(2, 16, num_landmarks=16, pinv_iters=20)
        errors[name] = max_real_error(attn(q, k, v, mask), dense_softmax_weights(q, k, mask) @ v, mask)
    assert errors["low"] * 20 < errors["full"], errors


def test_overwrite_rows_makes_rows_I_exact_and_leaves_others_approximate():
    q, k, v = random_qkv(n=64, d=8)
    mask = padded_mask(2, 64, [64, 50])
    ref = dense_softmax_weights(q, k, mask) @ v
    index_q, index_k = select_indices(q, k, mask, 8, "abs")
    y = cur_attention(q, k, v, mask, index_q, index_k, SoftmaxScore(), 6, overwrite_rows=True)
    rows = torch.zeros(2, 2, 64, dtype=torch.bool).scatter(2, index_q, True)
    assert (y - ref)[rows].abs().max() < 1e-12
    assert (y - ref)[~rows & mask[:, None, :]].abs().max() > 1e-3
    y_plain = cur_attention(q, k, v, mask, index_q, index_k, SoftmaxScore(), 6, overwrite_rows=False)
    assert torch.equal(y[~rows], y_plain[~rows])


def test_matches_an_explicit_dense_CUR_on_given_indices():
    """C, U, R built from the full attention logits with Python index lists, exact pseudo-inverse."""
    q, k, v = random_qkv(n=30, d=8)
    mask = padded_mask(2, 30, [30, 21])
    index_q, index_k = select_indices(q, k, mask, 6, "embed", same_indices=False)
    y = cur_attention(q, k, v, mask, index_q, index_k, None, pinv_iters=40, overwrite_rows=False)
    logits = torch.einsum("bhid,bhjd->bhij", q, k) / 8**0.5
    for b in range(2):
        for h in range(2):
            I, J = index_q[b, h].tolist(), index_k[b, h].tolist()
            C = torch.softmax(logits[b, h][:, J], -1)
            R = torch.softmax(logits[b, h][I].masked_fill(~mask[b], float("-inf")), -1)
            expected = C @ torch.linalg.pinv(C[I]) @ R @ v[b, h]
            assert (y[b, h] - expected).abs().max() < 1e-8


@pytest.mark.parametrize("selection", ["sum", "abs", "embed", "step"])
@pytest.mark.parametrize("score", [None, L1Score])
def test_padding_invariance(selection, score):
    assert_padding_invariant(cur(score, num_landmarks=6, selection=selection))
    assert_padding_invariant(cur(score, num_landmarks=64, selection=selection, overwrite_rows=False))


@pytest.mark.parametrize("score", [SoftmaxScore(), L1Score(1.5)], ids=["softmax", "l1"])
def test_gradcheck_with_fixed_indices(score):
    q, k, v = (x.requires_grad_() for x in random_qkv(batch=1, heads=2, n=7, d=3))
    mask = padded_mask(1, 7, [6])
    index_q, index_k = select_indices(q, k, mask, 3, "abs", same_indices=False)

    def f(q, k, v):
        return cur_attention(q, k, v, mask, index_q, index_k, score, 3, overwrite_rows=True)

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_no_grad_forward_of_inputs_that_require_grad():
    """Under ``no_grad`` (evaluation, benchmarks) no autograd node wraps the inputs: the score modules get
    plain tensors (``FlopCounterMode``'s module tracker rejects views without a grad_fn)."""
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = (x.requires_grad_() for x in random_qkv(n=30, d=8))
    mask = padded_mask(2, 30, [30, 21])
    attn = cur(num_landmarks=6)
    with torch.no_grad(), FlopCounterMode(display=False):
        y = attn(q, k, v, mask)
    assert not y.requires_grad
    torch.testing.assert_close(y, attn(q, k, v, mask).detach(), atol=0, rtol=0)


@pytest.mark.parametrize("attention", ["curformer", "l1_cur"])
def test_bf16_training_step_is_finite(attention):
    bf16_training_step([f"attention={attention}", "attention.num_landmarks=8"])


def test_configs_build_cur_with_the_configured_score():
    softmax_cur = build_attention(compose_config(["attention=curformer"]).attention, 2, 32)
    l1_cur = build_attention(compose_config(["attention=l1_cur", "attention.score.lam=3"]).attention, 2, 32)
    assert isinstance(softmax_cur.score, SoftmaxScore) and softmax_cur.num_landmarks == 64
    assert isinstance(l1_cur, CURAttention) and isinstance(l1_cur.score, L1Score) and l1_cur.score.lam == 3.0
    assert softmax_cur.selection == "abs" and softmax_cur.pinv_iters == 6 and softmax_cur.overwrite_rows


@pytest.mark.parametrize(
    "override, message",
    [
        ("attention.num_landmarks=0", "num_landmarks"),
        ("attention.num_landmarks=2.5", "num_landmarks"),
        ("attention.selection=best", "attention.selection='best'"),
        ("attention.pinv_iters=0", "pinv_iters"),
        ("attention.pinv_init=batch", "attention.pinv_init"),
        ("attention.embed_column=40", "embed_column"),
    ],
)
def test_bad_config_is_a_clear_error_at_build_time(override, message):
    cfg = compose_config(["attention=curformer", override])
    with pytest.raises(ValueError, match=message):
        build_attention(cfg.attention, 2, 32)


@pytest.mark.parametrize("pinv_init", ["per_head", "global"])
@pytest.mark.parametrize("attention, dense", [("curformer", dense_softmax_weights), ("l1_cur", dense_l1_weights)])
def test_matches_dense_CUR_with_either_pinv_init(attention, dense, pinv_init):
    """Config -> module at the default 6 iterations and overwrite_rows, against C, U, R cut from the dense
    attention matrix's logits and the float64 pseudo-inverse reference of ``tests/attention/test_pinv.py``."""
    from tests.attention.test_pinv import reference_pinv

    q, k, v = random_qkv(batch=2, heads=2, n=20, d=8)
    q[1], k[1] = 3 * q[1], 3 * k[1]  # sequence 1 sharper: larger column sums of its U
    mask = torch.ones(2, 20, dtype=torch.bool)
    cfg = compose_config([f"attention={attention}", "attention.num_landmarks=5", f"attention.pinv_init={pinv_init}"])
    attn = build_attention(cfg.attention, 2, 8)
    assert attn.pinv_init == pinv_init and attn.pinv_iters == 6 and attn.overwrite_rows
    index_q, index_k = attn.select(q, k, mask)
    logits = dense(q, k, mask).log()  # softmax is shift-invariant: row-wise softmax of a column subset of these
    C = torch.stack([torch.stack([torch.softmax(logits[b, h][:, index_k[b, h]], -1) for h in range(2)]) for b in range(2)])
    R = torch.stack([torch.stack([dense(q, k, mask)[b, h][index_q[b, h]] for h in range(2)]) for b in range(2)])
    U = torch.stack([torch.stack([C[b, h][index_q[b, h]] for h in range(2)]) for b in range(2)])

    def expected(init):
        y = C @ reference_pinv(U, 6, init) @ R @ v
        for b in range(2):
            for h in range(2):
                y[b, h, index_q[b, h]] = (R @ v)[b, h]  # overwrite_rows
        return y

    got = attn(q, k, v, mask)
    torch.testing.assert_close(got, expected(pinv_init), atol=1e-10, rtol=0)
    assert (got - expected("global" if pinv_init == "per_head" else "per_head")).abs().max() > 1e-3
