"""Dense reference computations and shared checks for the attention tests (written independently
of ``attention/``: full ``n × n`` matrices, explicit loops where it keeps them obvious)."""

from __future__ import annotations

import torch

from kernels.l1 import naive as l1_naive
from tests.conftest import compose_config


def dense_softmax_weights(q, k, key_mask):
    """``softmax(QKᵀ/√d)`` with pad keys at -inf: ``(B, H, n, n)``."""
    logits = torch.einsum("bhid,bhjd->bhij", q, k) / q.shape[-1] ** 0.5
    return torch.softmax(logits.masked_fill(~key_mask[:, None, None, :], float("-inf")), dim=-1)


def dense_l1_weights(q, k, key_mask, lam=1.0):
    """``softmax(−λ‖q_i − k_j‖₁/√d)`` with pad keys at -inf, via the full ``(B, H, n, n, d)`` difference (the L1
    kernels' plain reference, :func:`kernels.l1.naive.weights`)."""
    return l1_naive.weights(q, k, key_mask, lam)


def random_qkv(batch=2, heads=2, n=24, d=8, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, heads, n, d, generator=generator, dtype=dtype) for _ in range(3))


def padded_mask(batch, n, lengths):
    """Bool ``(batch, n)`` with the first ``lengths[b]`` tokens real."""
    return torch.arange(n)[None, :] < torch.as_tensor(lengths)[:, None]


def max_real_error(y, ref, key_mask):
    """Max abs difference over real query rows."""
    return (y - ref).abs().masked_fill(~key_mask[:, None, :, None], 0).max().item()


def assert_padding_invariant(attn, n=20, extra=9, d=8, seed=0):
    """Appending pad tokens (with arbitrary values) leaves the outputs of real tokens unchanged."""
    q, k, v = random_qkv(batch=2, n=n, d=d, seed=seed, dtype=torch.float32)
    mask = padded_mask(2, n, [n, n - 5])
    junk = random_qkv(batch=2, n=extra, d=d, seed=seed + 1, dtype=torch.float32)
    longer = [torch.cat([x, 100 * j], dim=2) for x, j in zip((q, k, v), junk)]
    longer_mask = torch.cat([mask, torch.zeros(2, extra, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        short_out = attn(q, k, v, mask)
        long_out = attn(*longer, longer_mask)[:, :, :n]
    error = max_real_error(long_out, short_out, mask)
    assert error < 1e-5, f"padding changed real outputs by {error}"


def bf16_training_step(attention_overrides: list[str]) -> None:
    """One forward/backward of the configured encoder under bf16 autocast: loss and grads finite."""
    from lra.build import build_model

    cfg = compose_config(["task=listops_small", "task.max_length=48", *attention_overrides])
    torch.manual_seed(0)
    model = build_model(cfg)
    ids = torch.randint(1, cfg.task.vocab_size, (3, 48))
    mask = padded_mask(3, 48, [48, 30, 7])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, aux = model(ids, mask)
        loss = torch.nn.functional.cross_entropy(logits.float(), torch.tensor([0, 1, 2]))
    loss.backward()
    assert torch.isfinite(loss)
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), f"non-finite grad in {name}"


def low_and_full_rank_qk(batch=2, heads=2, n=256, d=16, rank=2, scale=0.5, seed=0):
    """``(q, k)`` pairs with rows of norm ``scale·√d``: full-rank random, and confined to a ``rank``-dim subspace
    (then ``exp(QKᵀ/√d)`` has a fast-decaying spectrum: numerical rank ≈ a few × ``rank``, below m)."""
    generator = torch.Generator().manual_seed(seed)

    def rows_of_norm(x):
        return x / x.norm(dim=-1, keepdim=True) * scale * d**0.5

    full = tuple(rows_of_norm(torch.randn(batch, heads, n, d, generator=generator, dtype=torch.float64)) for _ in range(2))
    basis = torch.linalg.qr(torch.randn(d, rank, generator=generator, dtype=torch.float64))[0].T  # (rank, d)
    low = tuple(
        rows_of_norm(torch.randn(batch, heads, n, rank, generator=generator, dtype=torch.float64) @ basis)
        for _ in range(2)
    )
    return low, full
