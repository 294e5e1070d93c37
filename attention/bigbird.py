"""BigBird attention, ITC block-sparse form (Zaheer et al., "Big Bird: Transformers for Longer Sequences",
NeurIPS 2020, §2 and App. D; code: google-research/bigbird ``bigbird_block_sparse_attention``, the Long Range Arena's
``lra_benchmarks/models/bigbird/bigbird_attention.py`` and Hugging Face's ``BigBirdBlockSparseAttention``).

The padded sequence (n' = ⌈n/b⌉·b, zero-padded, pads masked) is cut into nb = n'/b blocks of b tokens. Query block
i attends, with ordinary softmax ``softmax(q Kᵀ/√d + M) V`` over the union of its key blocks, to

* i ∈ {0, nb−1} (the **2 global blocks**, "ITC": internal tokens as global): every key;
* 1 ≤ i ≤ nb−2: the **3-block window** {i−1, i, i+1}, the global blocks {0, nb−1}, and **r random blocks**
  R_i (per head), drawn uniformly without replacement from the LRA code's candidates
  ``C_i = {j : 1 ≤ j ≤ U_i, |j − i| > 1}``, ``U_i = min(nb − 2, L)`` with ``L = min(n', random_span)/b − 1``
  (its ``get_block_rand_mask(..., last_idx=min(n', 1024))``: random blocks come from the first 1024 tokens), and
  for i ≥ 3 the LRA code's last two rows ``U_{nb−3} = min(nb − 2, L − 4)``, ``U_{nb−2} = min(nb − 2, L − 3)``
  (equal to the general rule unless the span caps L). ``random_span: null`` draws from the whole sequence.

Every key block a row lists appears once (the window of rows 1 and nb−2 meets a global block: the copy is
masked). The window and the two global blocks are fixed by the method (ITC; Hugging Face: "window size is fixed to
3 blocks ... number of global blocks are fixed (2 blocks here)"), so only b, r and the random draw are settings.

Random draw: as the references, a permutation of C_i with its first r kept, i.e. the r members of C_i with the
smallest random priorities. The priorities are an integer hash of ``(seed, head, i, j)`` computed from ``arange`` on
the inputs' device at each call (no host sync, no cached CPU tensor, one ``torch.compile`` graph); the LRA code and
Hugging Face draw from numpy's global generator (seeded per layer), so the two agree in distribution, not in the
draw; the tests copy our blocks into Hugging Face's module. Every layer built from one config shares ``seed``, so
its layers share the random blocks (LRA: a seed per layer from the module's path; Hugging Face: the layer index).
Hugging Face's ``seq_len in [1024, 3072, 4096]`` branch (a copy of the LRA rule missing its "-3"/"-4", so
the last two rows may repeat window blocks) and its eval mode (all random blocks set to block 0) are not followed.

Short sequences: where C_i has fewer than r members, R_i is all of C_i (the unused slots are masked; the LRA and
Hugging Face code fail there, and Hugging Face's ``BigBirdModel`` switches to full attention for n' ≤ (5 + 2r)·b).
For nb ≤ 4 the window and global blocks cover every pair, and so does nb ≤ 7 with r ≥ 3 and n' ≤ ``random_span``
(C_i ⊆ R_i): there the output is dense softmax over the real keys (``task=listops_small``, n ≤ 200 with b = 64, is
such a case; LRA ListOps, n' = 2048, is 32 blocks). No attention dropout: neither reference drops block-sparse
weights.

Shapes: ``q, k`` ``(B, H, n, d)``, ``v`` ``(B, H, n, e)``, ``key_mask`` bool ``(B, n)`` -> ``(B, H, n, e)`` (e = d in
the model; the diagnostics' ``V = I`` has e = n). Cost O(n·b·(5 + r)·d)
time and O(n·b·(5 + r)) memory for the scores (the two global rows: O(b·n·d) each): the key and value blocks of
each row are gathered with one ``index_select`` (``(B, H, nb−2, (5 + r)·b, d)``), then one batched matmul; no
n × n tensor, no loop over blocks.

Padding: pads never receive weight (masked in every gathered block and in the global rows), and their values do
not reach real outputs. The block layout is fixed by n', not by the real length: appending pads that keep ⌈n/b⌉
leaves every real output unchanged; pads that add blocks move the last global block (real tokens stop being global)
and the candidates C_i, so real outputs change. n' is the next multiple of b (LRA's code always appends at least
one token, a whole block when b divides n); any n is accepted, so there is no "b does not divide n" error.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attention.config_checks import check_positive_int

_MASK32 = 0xFFFFFFFF
_UNPICKED = 1 << 32  # above every 32-bit priority


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (two xor-shift-multiply rounds) of int64 ``x`` in [0, 2³²); products stay < 2⁶³."""
    for _ in range(2):
        x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    return (x >> 16) ^ x


def random_candidates(num_blocks: int, last: int, device=None) -> torch.Tensor:
    """Bool ``(nb − 2, nb)``: row i − 1 marks C_i, the blocks query block i (1 ≤ i ≤ nb − 2) may draw at random."""
    i = torch.arange(1, num_blocks - 1, device=device)[:, None]
    j = torch.arange(num_blocks, device=device)[None, :]
    upper = torch.where((i == num_blocks - 3) & (i >= 3), last - 4, last)
    upper = torch.where((i == num_blocks - 2) & (i >= 3), last - 3, upper).clamp(max=num_blocks - 2)
    return (j >= 1) & (j <= upper) & ((j - i).abs() > 1)


def random_blocks(num_blocks: int, num_heads: int, num_random: int, last: int, seed: int, device=None):
    """``(ids, drawn)``, both ``(H, nb − 2, min(r, nb))``: per head and middle query block, the ids of its random
    key blocks (the candidates of smallest hashed priority, ascending) and whether each slot holds a candidate."""
    heads = torch.arange(num_heads, device=device)[:, None, None]
    rows = torch.arange(1, num_blocks - 1, device=device)[None, :, None]
    cols = torch.arange(num_blocks, device=device)[None, None, :]
    priority = _mix(_mix(_mix(_mix(torch.full((), seed & _MASK32, device=device)) ^ heads) ^ rows) ^ cols)
    priority = priority.masked_fill(~random_candidates(num_blocks, last, device), _UNPICKED)
    picked, ids = priority.topk(min(num_random, num_blocks), dim=-1, largest=False, sorted=True)
    return ids, picked < _UNPICKED


class BigBirdAttention(nn.Module):
    """BigBird ITC block-sparse attention: window, global and random key blocks (see the module docstring)."""

    def __init__(self, num_heads: int, head_dim: int, block_size: int = 64, num_random_blocks: int = 3,
                 random_span: int | None = 1024, seed: int = 0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.block_size = check_positive_int(block_size, "block_size")
        if isinstance(num_random_blocks, bool) or not isinstance(num_random_blocks, int) or num_random_blocks < 0:
            raise ValueError(f"attention.num_random_blocks must be an integer >= 0 (0: window and global blocks "
                             f"only), got {num_random_blocks!r}")
        self.num_random_blocks = num_random_blocks
        if random_span is not None and (isinstance(random_span, bool) or not isinstance(random_span, int)
                                        or random_span <= 2 * block_size):
            raise ValueError(f"attention.random_span must be null (random blocks from the whole sequence) or an "
                             f"integer > 2 * attention.block_size = {2 * block_size}, got {random_span!r}")
        self.random_span = random_span
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"attention.seed must be an integer, got {seed!r}")
        self.seed = seed

    def layout(self, num_blocks: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids, allowed)``, both ``(H, nb − 2, 5 + r')``: the key blocks of query blocks 1…nb−2 (global 0 and nb−1,
        window i−1, i, i+1, then the random ones) and which slots count (a repeated block or an undrawn slot not)."""
        padded = num_blocks * self.block_size
        span = padded if self.random_span is None else min(padded, self.random_span)
        last = span // self.block_size - 1
        rows = torch.arange(1, num_blocks - 1, device=device)[:, None]
        fixed = torch.cat([torch.zeros_like(rows), torch.full_like(rows, num_blocks - 1), rows - 1, rows, rows + 1], 1)
        earlier = torch.ones(5, 5, dtype=torch.bool, device=device).tril(-1)
        first = ~((fixed[:, :, None] == fixed[:, None, :]) & earlier).any(-1)  # (nb − 2, 5): not a repeat
        rand_ids, drawn = random_blocks(num_blocks, self.num_heads, self.num_random_blocks, last, self.seed, device)
        heads = self.num_heads
        ids = torch.cat([fixed.expand(heads, -1, -1), rand_ids], -1)
        return ids, torch.cat([first.expand(heads, -1, -1), drawn], -1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        batch, heads, n, d = q.shape
        b = self.block_size
        pad = (-n) % b
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        real = F.pad(key_mask, (0, pad), value=False)  # (B, n')
        nb = (n + pad) // b
        scale = d**-0.5
        qb = q.unflatten(2, (nb, b))  # (B, H, nb, b, d)

        # the global query blocks 0 and nb − 1: every real key
        global_rows = torch.cat([qb[:, :, :1], qb[:, :, -1:]], 2) if nb > 1 else qb
        scores = (global_rows.flatten(2, 3) @ k.transpose(-1, -2)) * scale  # (B, H, g·b, n')
        # a finite floor, not -inf: an all-pad row (pad queries only) gets finite weights instead of NaN
        floor = torch.finfo(scores.dtype).min
        out_global = scores.masked_fill(~real[:, None, None, :], floor).softmax(-1) @ v
        if nb <= 2:
            return out_global[:, :, :n]

        # query blocks 1 … nb − 2: their (5 + r') key blocks, gathered
        ids, allowed = self.layout(nb, q.device)  # (H, M, W), M = nb − 2
        middle, width = ids.shape[1:]
        flat = (ids + nb * torch.arange(heads, device=q.device)[:, None, None]).flatten()  # rows of (H·nb) blocks
        keys, values = (x.reshape(batch, heads * nb, b * x.shape[-1]).index_select(1, flat)
                        .view(batch, heads, middle, width * b, x.shape[-1]) for x in (k, v))  # (B, H, M, W·b, d or e)
        key_real = real.view(batch, nb, b).index_select(1, ids.flatten()).view(batch, heads, middle, width, b)
        key_real = (key_real & allowed[..., None]).view(batch, heads, middle, 1, width * b)
        scores = (qb[:, :, 1:-1] @ keys.transpose(-1, -2)) * scale  # (B, H, M, b, W·b)
        out_middle = scores.masked_fill(~key_real, floor).softmax(-1) @ values  # (B, H, M, b, e)
        out = torch.cat([out_global[:, :, None, :b], out_middle, out_global[:, :, None, b:]], 2)
        return out.flatten(2, 3)[:, :, :n]
