"""LSH attention (``attention/reformer.py``) against reformer-pytorch's ``LSHAttention`` with the same rotations,
against a plain dense form of the paper's equations (a softmax over the union of the rounds' targets), and its
exact limit: one chunk holding every token is dense softmax over the other tokens."""

import pytest
import torch
from reformer_pytorch.reformer_pytorch import LSHAttention

from attention.reformer import ReformerAttention
from lra.build import build_attention
from models.blocks import MultiHeadAttention
from tests.attention_reference import assert_padding_invariant, max_real_error, padded_mask, random_qkv
from tests.conftest import compose_config

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def sorted_positions(attn: ReformerAttention, q, key_mask):
    """``(B, H, rounds, n)``: each token's position in each round's bucket-sorted order (pads' bucket after all)."""
    rotated = torch.einsum("bhnd,rdk->bhrnk", q, attn.rotations.to(q.dtype))
    buckets = torch.cat([rotated, -rotated], -1).argmax(-1).masked_fill(~key_mask[:, None, None, :], attn.num_buckets)
    n = q.shape[-2]
    keys = buckets * n + torch.arange(n)  # bucket, then position
    return keys.argsort(-1).argsort(-1)


def paper_reference(attn: ReformerAttention, q, v, key_mask):
    """The paper's output written densely, loop by loop: query i attends, with ``softmax(q_iᵀk_j/√d)``,
    ``k_j = q_j/‖q_j‖``, to every real j that some round puts in its chunk or the chunk before (counted once),
    and to itself only when there is no such j. ``(B, H, n, d)``; pad rows 0."""
    chunk = torch.div(sorted_positions(attn, q, key_mask), attn.bucket_size, rounding_mode="floor")
    keys = q / q.norm(dim=-1, keepdim=True)
    out = torch.zeros_like(v)
    batch, heads, n, d = q.shape
    for b in range(batch):
        for h in range(heads):
            for i in range(n):
                if not key_mask[b, i]:
                    continue
                gap = chunk[b, h, :, i:i + 1] - chunk[b, h]  # (rounds, n)
                reach = ((gap == 0) | (gap == 1)).any(0) & key_mask[b]
                reach[i] = False
                if not reach.any():
                    reach[i] = True
                scores = (keys[b, h, reach] @ q[b, h, i]) / d**0.5
                out[b, h, i] = torch.softmax(scores, 0) @ v[b, h, reach]
    return out


def first_chunk_rows(attn: ReformerAttention, q, key_mask):
    """``(B, H, n)`` bool: tokens in the first chunk of some round (where the references look back across rounds)."""
    return (sorted_positions(attn, q, key_mask) < attn.bucket_size).any(2)


def test_matches_reformer_pytorch_off_the_first_chunks(monkeypatch):
    """reformer-pytorch 1.4.4, ``allow_duplicate_attention=False`` (the paper's N_ij), fed our rotations through its
    ``torch.randn`` call. It couples b = n/m and lets each round's first chunk look back at the previous round's last
    chunk (module docstring): rows in no round's first chunk must agree. It adds 1e-9 inside ``log N``: ~1e-9."""
    batch, heads, n, d, m = 2, 2, 64, 8, 8
    q, k, v = random_qkv(batch, heads, n, d)
    mask = torch.ones(batch, n, dtype=torch.bool)
    attn = build_attention(compose_config(["attention=reformer", f"attention.bucket_size={m}",
                                           f"attention.num_buckets={n // m}", "attention.seed=3"]).attention, heads, d)
    attn = attn.double()
    rotations = attn.rotations.permute(1, 0, 2)[None]  # theirs: (1, d, rounds, b/2), shared by batch and heads
    monkeypatch.setattr(torch, "randn", lambda shape, **kwargs: rotations.clone())
    reference = LSHAttention(bucket_size=m, n_hashes=2, allow_duplicate_attention=False)
    theirs, _, buckets = reference(q.flatten(0, 1), v.flatten(0, 1))
    monkeypatch.undo()
    theirs = theirs.view(batch, heads, n, d)
    compared = ~first_chunk_rows(attn, q, mask)
    assert compared.sum() > q.shape[:3].numel() // 2
    error = (attn(q, k, v, mask) - theirs).abs().amax(-1)
    assert error[compared].max() < 1e-8
    assert error[~compared].max() > 1e-3  # the look-back across rounds differs: the check can tell


@pytest.mark.parametrize("n_hashes", [1, 3])
def test_equals_the_papers_union_of_rounds_with_padding(n_hashes):
    q, k, v = random_qkv(n=21, d=8, seed=1)  # 21: padded inside to 24, 6 chunks of 4
    mask = padded_mask(2, 21, [21, 13])
    attn = ReformerAttention(2, 8, n_hashes=n_hashes, bucket_size=4, num_buckets=6, seed=1).double()
    assert max_real_error(attn(q, k, v, mask), paper_reference(attn, q, v, mask), mask) < 1e-12


def test_one_chunk_is_dense_softmax_over_the_other_tokens():
    """m ≥ n: every round reaches every pair, so the output is ``softmax(QKᵀ/√d)`` with ``K = Q/‖Q‖`` and the
    diagonal and pads masked, whatever the hashes."""
    q, k, v = random_qkv(n=20, d=8, seed=2)
    mask = padded_mask(2, 20, [20, 11])
    keys = q / q.norm(dim=-1, keepdim=True)
    logits = (q @ keys.transpose(-1, -2)) / 8**0.5
    logits = logits.masked_fill(torch.eye(20, dtype=torch.bool) | ~mask[:, None, None, :], -torch.inf)
    dense = torch.softmax(logits, -1) @ v
    for n_hashes in (1, 2):
        attn = ReformerAttention(2, 8, n_hashes=n_hashes, bucket_size=32, num_buckets=4).double()
        assert max_real_error(attn(q, k, v, mask), dense, mask) < 1e-12


def test_padding_invariant_and_pads_get_no_weight():
    attn = ReformerAttention(2, 8, bucket_size=4, num_buckets=4)
    assert_padding_invariant(attn)
    q, k, _ = random_qkv(n=20, d=8, seed=4)
    mask = padded_mask(2, 20, [20, 9])
    weights = attn.double()(q, k, torch.eye(20, dtype=torch.float64).expand(2, 2, 20, 20), mask)  # V = I: the weights
    assert torch.equal(weights[1, :, :9, 9:], torch.zeros(2, 9, 11, dtype=torch.float64))
    torch.testing.assert_close(weights[:, :, :9].sum(-1), torch.ones(2, 2, 9, dtype=torch.float64))


def test_a_token_alone_attends_to_itself():
    q, k, v = random_qkv(n=12, d=8, seed=5)
    mask = padded_mask(2, 12, [1, 12])
    out = ReformerAttention(2, 8, bucket_size=4, num_buckets=4).double()(q, k, v, mask)
    torch.testing.assert_close(out[0, :, 0], v[0, :, 0], rtol=0, atol=1e-12)


def test_rotations_seeded_and_redrawn_only_in_training():
    rotations = lambda seed: ReformerAttention(2, 8, num_buckets=32, seed=seed).rotations  # noqa: E731
    assert torch.equal(rotations(3), rotations(3)) and not torch.equal(rotations(3), rotations(4))
    q, k, v = random_qkv(n=40, d=8, seed=6, dtype=torch.float32)
    mask = torch.ones(2, 40, dtype=torch.bool)
    fixed = ReformerAttention(2, 8, bucket_size=4, num_buckets=8)
    redrawn = ReformerAttention(2, 8, bucket_size=4, num_buckets=8, redraw=True)
    assert not torch.equal(redrawn(q, k, v, mask), redrawn(q, k, v, mask))
    assert torch.equal(fixed(q, k, v, mask), fixed(q, k, v, mask))
    assert torch.equal(redrawn.eval()(q, k, v, mask), fixed(q, k, v, mask))


def test_keys_are_the_queries_so_k_proj_gets_a_zero_gradient():
    """Shared QK: the ``k`` argument is not read; ``k_proj`` is still in the graph (one GEMM for q, k, v), with an
    exactly zero gradient, so DDP without ``find_unused_parameters`` has a gradient for every parameter."""
    block = MultiHeadAttention(16, 2, lambda **sizes: ReformerAttention(**sizes, bucket_size=4, num_buckets=4))
    x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(7))
    block(x, padded_mask(2, 10, [10, 6])).square().sum().backward()
    assert torch.equal(block.k_proj.weight.grad, torch.zeros(16, 16))
    assert block.q_proj.weight.grad.abs().max() > 0


@pytest.mark.parametrize("settings, match", [({"n_hashes": 0}, "attention.n_hashes"),
                                             ({"bucket_size": 0}, "attention.bucket_size"),
                                             ({"num_buckets": 0}, "attention.num_buckets"),
                                             ({"num_buckets": 5}, "attention.num_buckets must be even"),
                                             ({"redraw": 1}, "attention.redraw"),
                                             ({"num_buckets": None, "max_length": 0}, "attention.max_length")])
def test_bad_settings_name_their_key(settings, match):
    with pytest.raises(ValueError, match=match):
        ReformerAttention(2, 8, **{"num_buckets": 4, **settings})

@pytest.mark.parametrize("task, buckets", [("listops", 32), ("text", 64), ("retrieval", 64), ("image", 32),
                                           ("pathfinder", 32), ("listops_small", 4)])
def test_the_bucket_count_follows_the_tasks_length_as_hugging_faces(task, buckets):
    """``num_buckets: null`` (the config's default): Hugging Face's ``_set_num_buckets`` rule for the padded length,
    ``2^⌊log2(2⌊n/64⌋)⌋``, from ``task.max_length``, as Xiong et al.'s LRA code (Proxyformer's Reformer-2*) pads
    every input to it; an explicit count still wins."""
    attn = build_attention(compose_config(["attention=reformer", f"task={task}"]).attention, 2, 8)
    assert attn.num_buckets == buckets and attn.rotations.shape[-1] == buckets // 2
    chosen = build_attention(compose_config(["attention=reformer", f"task={task}", "attention.num_buckets=8"]).attention,
                             2, 8)
    assert chosen.num_buckets == 8
    with pytest.raises(ValueError, match="num_buckets is null.*attention.max_length"):
        ReformerAttention(2, 8)
