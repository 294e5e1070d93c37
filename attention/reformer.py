"""Reformer's LSH attention (Kitaev, Kaiser, Levskaya, "Reformer: The Efficient Transformer", ICLR 2020, §2–3).

Shared QK (§2 "Shared-QK Transformer"): the keys are the queries, unit-normalised, ``k_j = q_j / ‖q_j‖``; the
``k`` argument is not read. Its projection ``k_proj`` (:class:`models.blocks.MultiHeadAttention`, kept so
checkpoints move between variants) then gets an exactly zero gradient: q, k, v come from one GEMM over the
three weights concatenated, so ``k_proj`` is in the graph (DDP with ``find_unused_parameters: false`` sees a
gradient for it) and only weight decay moves it (0 in configs/optimizer/adamw.yaml). A LoRA-wrapped or hooked
projection is called on its own: there ``k_proj``'s adapters get no gradient at all (DDP would need
``find_unused_parameters``). The other choice, dropping ``k_proj`` from the block, would change the checkpoint
keys every other variant shares.

Hashing (§2 "Locality sensitive hashing"): a random rotation ``R`` ``(d, b/2)`` per round, ``h(x) =
argmax([xR; −xR])`` over b = ``num_buckets`` buckets, on the queries (argmax is blind to the norm).
Per round r (``n_hashes`` rounds, each its own R): the tokens are sorted by bucket (ties by position, a stable
sort), the sorted sequence is cut into chunks of m = ``bucket_size`` tokens, and query i attends to
``P̃_i^(r) = {j : ⌊s_j/m⌋ ∈ {⌊s_i/m⌋ − 1, ⌊s_i/m⌋}}`` (s: sorted positions in round r; its own chunk and the
previous one, across bucket boundaries). Scores ``q_iᵀk_j/√d − m^(r)_ij`` with (§2, multi-round equations)
``m^(r)_ij = ∞`` for j ∉ P̃_i^(r) or a pad key, ``10⁵`` for j = i (no attention to self unless i has no other
target), else ``log N_ij``, ``N_ij = |{r' : j ∈ P̃_i^(r')}|``. Each round gives ``o_i^(r)`` and its log-sum-exp
``z_i^(r)``; ``o_i = Σ_r exp(z_i^(r) − LSE_r' z_i^(r')) o_i^(r)``. Together: a softmax over the union of the
rounds' targets, each key counted once however many rounds found it (the test checks exactly that).

Where references differ (we follow the paper's equations as we read them): reformer-pytorch 1.4.4
(``LSHAttention``), trax and Hugging Face's ``LSHSelfAttention`` let the first chunk of every round look back,
cyclically, at the last chunk of the previous round; §2's P̃_i has no chunk before the first. In reformer-pytorch
with ``allow_duplicate_attention=False`` (the paper's N_ij) such a cross-round pair is not counted: N_ij can be 0
and its score gains ``−log 1e-9 = +20.7``; its default counts no duplicates at all. Self is masked to an absolute
−5·10⁴ there, ``score − 10⁵`` here; both weigh self 0 unless alone. Off the first chunks the test matches it.

Rotations: one set ``(n_hashes, d, b/2)`` per layer shared by its heads and batch (reformer-pytorch's default).
The paper's, trax's, reformer-pytorch's and Hugging Face's layers (the one Nyströmformer's LRA code, behind the
Proxyformer table's "Reformer-2*", wraps) draw new rotations at every call, training and evaluation. Here
``redraw: false`` (default) keeps the set drawn from ``seed`` at construction (deterministic evaluation, compiled
= eager, a test can hand the same R to a reference: Hugging Face's ``hash_seed``); ``redraw: true`` draws fresh
ones from the device's generator at every training forward (evaluation keeps the seeded set).

Buckets and chunks: the paper pairs them as m = 2n/b (a chunk holds two average buckets); reformer-pytorch fixes
b = n/m; Hugging Face's ``LSHSelfAttention`` (the layer behind the Proxyformer table's "Reformer-2*"), given no
bucket count, takes b = 2^⌊log2(2⌊n/m⌋)⌋ from the padded length n of its first input, which LRA's code pads to
the task's maximum. ``num_buckets: null`` (the default) does the same from ``max_length`` (the task's): with
m = 64, 32 buckets at ListOps' n = 2000 and at Image's and Pathfinder's 1024, 64 at Text's and Retrieval's 4000;
an integer sets b. Any n works: the sequence is padded inside to n', a multiple of m.

Padding: pad tokens (``key_mask`` False, and the pads to n') get the bucket b, after every real bucket, so in
every round they sort after the real tokens. Appending pads therefore leaves each real token's bucket, sorted
position, chunk, targets and N_ij unchanged, and pads get weight exactly 0: real outputs are invariant
(tested). That holds because b and R do not depend on n and chunks never wrap across rounds; in the references
(b from the length, pads hashed by their values, cyclic look-back) appending pads moves buckets and chunk
boundaries. With ``redraw: true`` two training calls differ anyway (different R).

Shapes: ``q, k`` ``(B, H, n, d)``, ``v`` ``(B, H, n, e)``, ``key_mask`` bool ``(B, n)`` -> ``(B, H, n, e)``.
Cost per round O(n log n) for the sort and O(n m d) for the ``(B, H, r, n'/m, m, 2m)`` batched scores; no loop
over tokens or chunks.
Computed in at least float32 with autocast off (the 10⁵ self offset overflows float16).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attention.config_checks import check_positive_int
from kernels.common.precision import autocast_off

SELF_PENALTY = 1e5  # the paper's m_ii: self only when nothing else is in reach


def window(x: torch.Tensor) -> torch.Tensor:
    """``(..., c, m, e)`` chunks -> ``(..., c, 2m, e)``: each chunk followed by the one before it (chunk 0 gets
    the last chunk, which the caller masks)."""
    return torch.cat([x, x.roll(1, dims=-3)], dim=-2)


def buckets_for_length(max_length: int | None, bucket_size: int) -> int:
    """Hugging Face's bucket count for sequences padded to ``max_length``: ``2^⌊log2(2⌊n/m⌋)⌋``, at least 2."""
    if max_length is None:
        raise ValueError("attention.num_buckets is null, which takes the bucket count from attention.max_length "
                         "(the task's, ${task.max_length}): set one of them")
    pairs = 2 * (check_positive_int(max_length, "max_length") // bucket_size)
    return max(2, 2 ** (pairs.bit_length() - 1)) if pairs else 2


class ReformerAttention(nn.Module):
    """Multi-round LSH attention with shared QK (see the module docstring)."""

    def __init__(self, num_heads: int, head_dim: int, n_hashes: int = 2, bucket_size: int = 64,
                 num_buckets: int | None = None, max_length: int | None = None, redraw: bool = False, seed: int = 0):
        super().__init__()
        self.n_hashes = check_positive_int(n_hashes, "n_hashes")
        self.bucket_size = check_positive_int(bucket_size, "bucket_size")
        if num_buckets is None:
            num_buckets = buckets_for_length(max_length, self.bucket_size)
        if check_positive_int(num_buckets, "num_buckets") % 2:
            raise ValueError(f"attention.num_buckets must be even (h(x) = argmax([xR; -xR]) has 2 buckets per "
                             f"column of R), got {num_buckets}")
        if not isinstance(redraw, bool):
            raise ValueError(f"attention.redraw must be true or false, got {redraw!r}")
        self.num_buckets = num_buckets
        self.redraw = redraw
        self.head_dim = head_dim
        generator = torch.Generator().manual_seed(seed)
        self.register_buffer("rotations", torch.randn(n_hashes, head_dim, num_buckets // 2, generator=generator))

    def buckets(self, q: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """``(B, H, r, n')`` bucket of every token in every round; pads get ``num_buckets`` (sorted last)."""
        rotations = self.rotations
        if self.redraw and self.training:
            rotations = torch.randn(rotations.shape, device=q.device, dtype=q.dtype)
        rotated = torch.einsum("bhnd,rdk->bhrnk", q, rotations.to(q.dtype))
        hashed = torch.cat([rotated, -rotated], dim=-1).argmax(-1)
        return torch.where(real[:, None, None, :], hashed, self.num_buckets)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        n, d, out_dtype = q.shape[-2], q.shape[-1], q.dtype
        m, rounds = self.bucket_size, self.n_hashes
        pad = (-n) % m
        dtype = torch.promote_types(q.dtype, torch.float32)
        with autocast_off(q.device.type):
            q, v = (F.pad(x.to(dtype), (0, 0, 0, pad)) for x in (q, v))
            real = F.pad(key_mask, (0, pad), value=False)  # (B, n')
            n_pad = n + pad
            chunks = n_pad // m
            # sort each round by bucket; `order[s]` is the token at sorted position s, `undo[t]` token t's position
            order = torch.sort(self.buckets(q, real), dim=-1, stable=True).indices  # (B, H, r, n')
            positions = torch.arange(n_pad, device=q.device).expand_as(order)
            undo = torch.empty_like(order).scatter_(-1, order, positions)

            def sorted_chunks(x):  # (B, H, n', e) -> (B, H, r, n'/m, m, e) in round r's sorted order
                index = order.unsqueeze(-1).expand(-1, -1, -1, -1, x.shape[-1])
                gathered = x.unsqueeze(2).expand(-1, -1, rounds, -1, -1).gather(-2, index)
                return gathered.unflatten(-2, (chunks, m))

            sq, sv = sorted_chunks(q), sorted_chunks(v)
            keys = window(F.normalize(sq, dim=-1))  # (B, H, r, c, 2m, d): k_j = q_j/‖q_j‖
            t_query = order.unflatten(-1, (chunks, m)).unsqueeze(-1)  # (B, H, r, c, m, 1): token ids
            t_key = window(t_query).transpose(-1, -2)  # (B, H, r, c, 1, 2m)
            with torch.no_grad():
                bias = self.score_bias(real, undo, t_query, t_key, dtype)  # (B, H, r, c, m, 2m): −m_ij
            scores = (sq * d**-0.5) @ keys.transpose(-1, -2) + bias  # (B, H, r, c, m, 2m)
            lse = scores.logsumexp(-1, keepdim=True)  # (B, H, r, c, m, 1): z_i^(r)
            out = torch.softmax(scores, -1) @ window(sv)  # (B, H, r, c, m, e): o_i^(r)

            index = undo.unsqueeze(-1)  # back to token order
            out = out.flatten(3, 4).gather(-2, index.expand(-1, -1, -1, -1, out.shape[-1]))  # (B, H, r, n', d)
            lse = lse.flatten(3, 5).gather(-1, undo)  # (B, H, r, n')
            out = (out * torch.softmax(lse, dim=2).unsqueeze(-1)).sum(2)  # Σ_r exp(z^(r) − LSE_r z) o^(r)
        return out[:, :, :n].to(out_dtype)

    def score_bias(self, real: torch.Tensor, undo: torch.Tensor, t_query: torch.Tensor, t_key: torch.Tensor,
                   dtype: torch.dtype) -> torch.Tensor:
        """``−m^(r)_ij`` ``(B, H, r, c, m, 2m)`` for the queries ``t_query`` ``(B, H, r, c, m, 1)`` and their reach
        ``t_key`` ``(B, H, r, c, 1, 2m)`` (token ids): −∞ off reach (chunk 0 has no previous chunk) or on a pad key
        of a real query (a pad query may attend anything: a finite row, its output is discarded), −10⁵ on self,
        else ``−log N_ij`` with ``N_ij`` the rounds r' in which ``⌊s_i/m⌋ − ⌊s_j/m⌋ ∈ {0, 1}`` (s: round r''s
        sorted positions; ``undo`` ``(B, H, r, n')`` holds them)."""
        m, chunks = t_query.shape[-2], t_query.shape[3]
        real_key = real.gather(-1, t_key.flatten(1)).view(t_key.shape)
        real_query = real.gather(-1, t_query.flatten(1)).view(t_query.shape)
        in_reach = torch.arange(2 * m, device=real.device) < m  # own chunk ...
        in_reach = in_reach | (torch.arange(chunks, device=real.device) > 0)[:, None, None]  # ... or c > 0
        allowed = (real_key | ~real_query) & in_reach
        bias = torch.where(t_query == t_key, -SELF_PENALTY, 0.0).to(dtype)
        if self.n_hashes > 1:
            chunk_of = torch.div(undo, m, rounding_mode="floor").to(torch.int32)  # (B, H, r', n')
            count = None
            for other in range(self.n_hashes):  # N_ij, one round r' at a time (a few elementwise ops each)
                gap = (chunk_of[:, :, other].gather(-1, t_query.flatten(2)).view(t_query.shape)
                       - chunk_of[:, :, other].gather(-1, t_key.flatten(2)).view(t_key.shape))
                hit = (gap == 0) | (gap == 1)
                count = hit.to(torch.int32) if count is None else count + hit
            log_count = torch.arange(self.n_hashes + 1, device=real.device, dtype=dtype).log()  # a table: N ≤ rounds
            bias = bias - log_count[count]
        return bias.masked_fill(~allowed, -torch.inf)
