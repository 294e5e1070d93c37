"""Orthoformer (``attention/orthoformer.py``) against Algorithm 1 and the attention of Patrick et al. 2021 written
out per sequence and head as the authors' Motionformer ``orthoformer_helper.py`` does it (read with the fetch tool;
no package), on each sequence cut to its real tokens, with the same random first landmark."""

import pytest
import torch

from attention.orthoformer import OrthoformerAttention
from lra.build import build_attention
from tests.attention_reference import assert_padding_invariant, max_real_error, padded_mask, random_qkv
from tests.conftest import compose_config

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def reference(q, k, v, lengths, m, seed):
    """Per (batch, head): greedy most-orthogonal landmarks among the real queries (first: the seeded draw's argmax
    over real tokens, as the module draws it), then softmax(Q Lᵀ) softmax(L Kᵀ) V with q, k scaled by d^{-1/4}."""
    torch.manual_seed(seed)
    draw = torch.rand(q.shape[:-1])
    scale = q.shape[-1] ** -0.25
    out = torch.zeros_like(q)
    for b, length in enumerate(lengths):
        for h in range(q.shape[1]):
            qs, ks, vs = q[b, h, :length] * scale, k[b, h, :length] * scale, v[b, h, :length]
            unit = qs / qs.norm(dim=-1, keepdim=True)
            chosen = [int(draw[b, h, :length].argmax())]
            sims = []
            while len(chosen) < min(m, length):
                sims.append((unit @ unit[chosen[-1]]).abs())
                worst = torch.stack(sims, -1).amax(-1)
                worst[chosen] = 10.0  # the authors' marker for already selected
                chosen.append(int(worst.argmin()))
            landmarks = qs[chosen]
            out[b, h, :length] = torch.softmax(qs @ landmarks.T, -1) @ (torch.softmax(landmarks @ ks.T, -1) @ vs)
    return out


@pytest.mark.parametrize("m", [4, 30])  # 30 > every real length: all real tokens become landmarks
def test_matches_algorithm_1_written_out(m):
    q, k, v = random_qkv(n=21, d=8)
    mask = padded_mask(2, 21, [21, 12])
    attn = build_attention(compose_config(["attention=orthoformer", f"attention.num_landmarks={m}"]).attention, 2, 8)
    torch.manual_seed(7)
    y = attn(q, k, v, mask)
    assert max_real_error(y, reference(q, k, v, [21, 12], m, 7), mask) < 1e-12


def test_landmarks_are_near_orthogonal():
    """In d = 4 the greedy choice of 4 landmarks from many random directions is close to an orthogonal basis."""
    from attention.orthoformer import orthogonal_landmarks
    q = torch.randn(1, 1, 400, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    indices, valid = orthogonal_landmarks(q, torch.ones(1, 1, 400, dtype=torch.bool), 4)
    unit = torch.nn.functional.normalize(q[0, 0, indices[0, 0]], dim=-1)
    off_diagonal = (unit @ unit.T - torch.eye(4, dtype=torch.float64)).abs().max()
    assert valid.all() and off_diagonal < 0.35


def test_padding_invariant_when_every_real_token_is_a_landmark():
    assert_padding_invariant(OrthoformerAttention(2, 8, num_landmarks=25))


def test_bad_settings_name_their_key():
    with pytest.raises(ValueError, match=r"attention\.num_landmarks"):
        OrthoformerAttention(2, 8, num_landmarks=0)
