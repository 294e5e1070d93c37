"""BigBird's block-sparse attention (``attention/bigbird.py``) against Hugging Face's ``BigBirdBlockSparseAttention``
with our random blocks, the LRA code's random-block rule (``get_block_rand_mask``, written out below from
google-research/long-range-arena ``lra_benchmarks/models/bigbird/bigbird_attention.py``), a dense masked softmax
over the pattern written out, and the exact limits (a pattern covering every pair = softmax)."""

import numpy as np
import pytest
import torch
from transformers.models.big_bird.modeling_big_bird import BigBirdBlockSparseAttention, BigBirdConfig, BigBirdModel

from attention.bigbird import BigBirdAttention, random_blocks, random_candidates
from lra.build import build_attention
from tests.attention_reference import assert_padding_invariant, dense_softmax_weights, max_real_error, padded_mask, random_qkv
from tests.conftest import compose_config

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def lra_block_rand_mask(m, wm, r, last_idx, rng):
    """The LRA code's ``get_block_rand_mask(m, m, wm, wm, r, last_idx)``: ``(m/wm − 2, r)`` random key blocks of query
    blocks 1…m/wm − 2 (its numpy assignment fails where a row has fewer than r candidates)."""
    rand_attn = np.zeros((m // wm - 2, r), dtype=np.int64)
    a = np.array(range(1, m // wm - 1))
    last = m // wm - 1
    if last_idx > 2 * wm:
        last = last_idx // wm - 1
    for i in range(1, m // wm - 1):
        start, end = i - 2, i
        if i == 1:
            rand_attn[i - 1, :] = rng.permutation(a[2:last])[:r]
        elif i == 2:
            rand_attn[i - 1, :] = rng.permutation(a[3:last])[:r]
        elif i == m // wm - 3:
            rand_attn[i - 1, :] = rng.permutation(a[:last - 4])[:r]
        elif i == m // wm - 2:
            rand_attn[i - 1, :] = rng.permutation(a[:last - 3])[:r]
        elif start > last:
            rand_attn[i - 1, :] = rng.permutation(a[:last])[:r]
        elif end + 1 == last:
            rand_attn[i - 1, :] = rng.permutation(a[:start])[:r]
        else:
            rand_attn[i - 1, :] = rng.permutation(np.concatenate((a[:start], a[end + 1:last])))[:r]
    return rand_attn


@pytest.mark.parametrize("padded, block, r, span", [(48, 4, 2, 1024), (2048, 64, 3, 1024), (80, 4, 2, 40)])
def test_random_blocks_follow_the_lra_rule(padded, block, r, span):
    """Our candidates C_i are exactly the blocks LRA's rule draws over many seeds (LRA ListOps' 2048 = 32 blocks of
    64, random blocks from the first 1024 tokens, among them); our draw takes min(r, |C_i|) distinct members."""
    nb = padded // block
    seen = np.zeros((nb - 2, nb), dtype=bool)
    rng = np.random.default_rng(0)
    for _ in range(300):
        picks = lra_block_rand_mask(padded, block, r, min(padded, span), rng)
        np.put_along_axis(seen, picks, True, axis=1)
    last = min(padded, span) // block - 1
    candidates = random_candidates(nb, last)
    assert np.array_equal(candidates.numpy(), seen)
    ids, drawn = random_blocks(nb, 4, r, last, seed=7)
    assert drawn.all() and ids.shape == (4, nb - 2, r)
    assert candidates[torch.arange(nb - 2)[:, None], ids].all()
    assert (ids.sort(-1).values.diff(dim=-1) > 0).all()  # distinct
    assert not torch.equal(ids[0], ids[1])  # drawn per head
    assert torch.equal(ids, random_blocks(nb, 4, r, last, seed=7)[0])
    assert not torch.equal(ids, random_blocks(nb, 4, r, last, seed=8)[0])


def hugging_face(ours: BigBirdAttention, x: torch.Tensor, mask: torch.Tensor) -> tuple:
    """Hugging Face's block-sparse attention (training mode: its random blocks come from its generator, replaced by
    ours) on hidden states ``x`` ``(B, n', H·d)``: ``(q, k, v, out)``, each ``(B, H, n', d)``, q/k/v from its own
    query/key/value layers."""
    batch, padded, hidden = x.shape
    heads, block = ours.num_heads, ours.block_size
    config = BigBirdConfig(hidden_size=hidden, num_attention_heads=heads, block_size=block,
                           num_random_blocks=ours.num_random_blocks, attention_type="block_sparse")
    torch.manual_seed(0)
    reference = BigBirdBlockSparseAttention(config, seed=0).double().train()
    ids, allowed = ours.layout(padded // block)
    assert allowed[:, :, 5:].all()  # a complete draw: Hugging Face's layout has exactly r random blocks a row
    random_ids = ids[:, :, 5:].numpy()
    reference._bigbird_block_rand_mask_with_head = lambda **_: list(random_ids)
    blocked, band, from_mask, to_mask = BigBirdModel.create_masks_for_block_sparse_attn(mask.double(), block)
    with torch.no_grad():
        out = reference(x, band_mask=band, from_mask=from_mask, to_mask=to_mask, from_blocked_mask=blocked,
                        to_blocked_mask=blocked)[0]
        q, k, v = (layer(x).unflatten(-1, (heads, -1)).transpose(1, 2)
                   for layer in (reference.query, reference.key, reference.value))
    return q, k, v, out.unflatten(-1, (heads, -1)).transpose(1, 2)


@pytest.mark.parametrize("n, block, r, span", [(37, 4, 2, 1024), (47, 4, 1, 24)])
def test_matches_hugging_face_block_sparse_attention(n, block, r, span):
    """n = 37 and 47 are cut to n' = 40 and 48 internally; Hugging Face gets the n' tokens with the rest masked.
    The second case caps the random blocks to the first 24 tokens (6 blocks)."""
    padded = -(-n // block) * block
    x = torch.randn(2, padded, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mask = padded_mask(2, padded, [n, n - 14])
    ours = build_attention(compose_config(["attention=bigbird", f"attention.block_size={block}",
                                           f"attention.num_random_blocks={r}", f"attention.random_span={span}"]).attention,
                           2, 8)
    q, k, v, expected = hugging_face(ours, x, mask)
    got = ours(q[:, :, :n], k[:, :, :n], v[:, :, :n], mask[:, :n])
    assert max_real_error(got, expected[:, :, :n], mask[:, :n]) < 1e-12


def dense_pattern(nb, block, ids, allowed):
    """Bool ``(H, n', n')`` written out block by block: global rows see all; row i its listed blocks."""
    heads = ids.shape[0]
    pattern = torch.zeros(heads, nb, nb, dtype=torch.bool)
    pattern[:, [0, nb - 1]] = True
    for h in range(heads):
        for i in range(1, nb - 1):
            for slot in range(ids.shape[-1]):
                if allowed[h, i - 1, slot]:
                    pattern[h, i, ids[h, i - 1, slot]] = True
    return pattern.repeat_interleave(block, 1).repeat_interleave(block, 2)


@pytest.mark.parametrize("n, block, r", [(23, 4, 3), (30, 3, 6)])
def test_short_sequences_match_the_pattern_written_out(n, block, r):
    """Too few candidates for r random blocks (Hugging Face's and LRA's code fail here): the row takes them all."""
    q, k, v = random_qkv(n=n, d=4, seed=3)
    mask = padded_mask(2, n, [n, n - 6])
    attn = BigBirdAttention(2, 4, block_size=block, num_random_blocks=r)
    nb = -(-n // block)
    ids, allowed = attn.layout(nb)
    assert not allowed[:, :, 5:].all()  # some row's draw is short
    pattern = dense_pattern(nb, block, ids, allowed)[:, :n, :n]
    logits = torch.einsum("bhid,bhjd->bhij", q, k) / 2
    expected = logits.masked_fill(~(pattern[None] & mask[:, None, None, :]), float("-inf")).softmax(-1) @ v
    assert max_real_error(attn(q, k, v, mask), expected, mask) < 1e-13


@pytest.mark.parametrize("n, block, r", [(5, 8, 3), (16, 8, 0), (10, 4, 0), (12, 3, 3), (14, 3, 3), (17, 3, 3),
                                         (20, 3, 3)])
def test_a_pattern_covering_every_pair_is_softmax(n, block, r):
    """nb = 1, 2, 3, 4 blocks: window and global blocks cover every pair; nb = 5, 6, 7 with r = 3: C_i ⊆ R_i too."""
    q, k, v = random_qkv(n=n, d=8, seed=1)
    mask = padded_mask(2, n, [n, n // 2 + 1])
    y = BigBirdAttention(2, 8, block_size=block, num_random_blocks=r)(q, k, v, mask)
    assert max_real_error(y, dense_softmax_weights(q, k, mask) @ v, mask) < 1e-13


def test_padding_invariant_while_the_block_count_holds():
    """18 and 20 tokens are both 5 blocks of 4: the layout is the same, the appended pads are masked."""
    assert_padding_invariant(BigBirdAttention(2, 8, block_size=4, num_random_blocks=1), n=18, extra=2)


@pytest.mark.parametrize("key, value", [("block_size", 0), ("num_random_blocks", -1), ("random_span", 8),
                                        ("seed", 1.5)])
def test_bad_settings_name_their_key(key, value):
    with pytest.raises(ValueError, match=rf"attention\.{key}"):
        BigBirdAttention(2, 8, **{"block_size": 4, key: value})
