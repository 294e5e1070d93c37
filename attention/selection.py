"""Row/column selection for CUR attention (François et al. 2025, §7.1; docs/design.md §2 "Selection rules").

:func:`select_indices` returns ``(index_q, index_k)``, each long ``(B, H, m')`` with
``m' = min(m, n)``, sorted ascending (in priority order in the ``fused`` form of other devices than the CPU,
:mod:`attention.impl`), distinct within a (sequence, head): the query rows ``I`` and
key rows ``J`` of ``C = score(Q, K_J)``, ``R = score(Q_I, K)``, ``U = C[I]``.

Every rule gives each token a priority; pad tokens get −inf, ``force_cls`` gives index 0 +inf, and
the ``m'`` highest priorities win (ties break by lowest index, as a stable sort ranks them). Priorities
per row of ``X`` (``X = Q`` for ``I`` and ``X = K`` for ``J``; with ``same_indices`` the priority is
``p(Q) + p(K)`` and ``I = J``):

* ``sum``: ``Σ_d X[i, d]``;   * ``abs``: ``Σ_d |X[i, d]|``;   * ``embed``: ``X[i, embed_column]``;
* ``step``: the real tokens of rank ``⌊j·n_real/m⌋``, ``j = 0..m−1`` (a uniform stride over real tokens);
* ``random``: uniform without replacement among real tokens (``generator`` for reproducibility).

**Decision (n_real < m):** all real tokens are selected and the remaining slots take the lowest pad
positions, so indices stay distinct and shapes stay ``m'``. Slots on pad positions are *invalid*
(``key_mask`` gathered at the index is False): CUR masks their columns of ``C``, sets their block of
``U`` to the identity and only overwrites pad rows with them, so CUR then equals exact attention
(``U = A``). Selection is not differentiated.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from attention import impl, landmark_stages, paths
from kernels.selection import cpu as selection_kernels


def _step_priority(x: torch.Tensor, key_mask: torch.Tensor, m: int, **_) -> torch.Tensor:
    """1 on real tokens of rank ``⌊j·n_real/m⌋`` (j < m), 0 on other tokens; ``(B, 1, n)``."""
    n = key_mask.shape[-1]
    n_real = key_mask.sum(-1, keepdim=True)  # (B, 1)
    ranks = torch.arange(m, device=x.device)[None, :] * n_real // m  # (B, m)
    real_first = torch.argsort((~key_mask).to(torch.int8), dim=-1, stable=True)  # (B, n): real positions in order
    positions = real_first.gather(-1, ranks.clamp_max(n - 1))
    priority = torch.zeros(key_mask.shape, dtype=torch.float32, device=x.device).scatter(-1, positions, 1.0)
    return priority[:, None, :]


def _random_priority(x: torch.Tensor, generator: torch.Generator | None = None, **_) -> torch.Tensor:
    return torch.rand(x.shape[:-1], generator=generator, device=x.device, dtype=torch.promote_types(x.dtype, torch.float32))


def _abs_priority(x: torch.Tensor, form: str = "cpu", **_) -> torch.Tensor:
    """``Σ_d |X[i, d]|``: one pass on CPU (:func:`kernels.selection.abs_row_sums`, else ``abs`` + ``sum``:
    ``linalg.vector_norm(x, ord=1)`` is slower on CPU, docs/bench.md "Numbers kept out of the code"); in the
    ``fused`` form (:mod:`attention.impl`) that norm, one kernel reading ``x`` in its dtype and summing in float32
    (float64 stays; no float32 copy of ``x``, no ``|x|`` tensor)."""
    if form == "fused":
        return torch.linalg.vector_norm(x, 1, -1, dtype=torch.promote_types(x.dtype, torch.float32))
    return selection_kernels.abs_row_sums(x) if form == "cpu" else x.abs().sum(-1)


RULES: dict[str, Callable[..., torch.Tensor]] = {
    "sum": lambda x, **_: x.sum(-1, dtype=torch.float32),
    "abs": _abs_priority,
    "embed": lambda x, embed_column, **_: x[..., embed_column].float(),
    "step": _step_priority,
    "random": _random_priority,
}


def check_selection(rule: str, embed_column: int, head_dim: int | None = None) -> None:
    """Config-time checks of ``attention.selection`` and ``attention.embed_column``."""
    if rule not in RULES:
        raise ValueError(f"attention.selection={rule!r} is not a selection rule; choose one of {sorted(RULES)}")
    if isinstance(embed_column, bool) or not isinstance(embed_column, int):
        raise ValueError(f"attention.embed_column must be an integer column index, got {embed_column!r}")
    if head_dim is not None and not -head_dim <= embed_column < head_dim:
        raise ValueError(f"attention.embed_column={embed_column} is out of range for head_dim={head_dim}")


def default_form(x: torch.Tensor) -> str:
    """The selection form ``attention.impl=auto`` gives CUR on ``x``'s device and dtype (:mod:`attention.impl`)."""
    return impl.resolve("cur", "auto", x.device.type, x.dtype).selection


def _top(priority: torch.Tensor, key_mask: torch.Tensor, m: int, force_cls: bool,
         form: str | None = None) -> torch.Tensor:
    """Indices of the ``m`` highest priorities ``(B, H, n)`` among real tokens, ascending -> ``(B, H, m)``.

    The indices a stable descending sort would rank first, without sorting over ``n``: every priority above
    the ``m``-th largest, then the lowest-index ties with it; no host synchronisation (NaN ranks as +inf). On CPU
    (float32, eager) the same by a kernel (:func:`kernels.selection.top_indices`).
    """
    form = form or default_form(priority)
    if form == "fused":
        return _top_by_sorting(priority, key_mask, m, force_cls)
    top = selection_kernels.top_indices(priority, key_mask, m, force_cls) if form == "cpu" else None
    if top is not None:
        return top
    priority = priority.nan_to_num(nan=torch.inf, posinf=torch.inf).masked_fill(~key_mask[:, None, :], -torch.inf)
    if force_cls:
        priority[..., 0] = torch.inf
    threshold = priority.topk(m, dim=-1, sorted=False).values.amin(-1, keepdim=True)  # m-th largest, (B, H, 1)
    above, tied = priority > threshold, priority == threshold
    chosen = above | (tied & (tied.cumsum(-1) <= m - above.sum(-1, keepdim=True)))  # exactly m per row
    slot = torch.where(chosen, chosen.cumsum(-1) - 1, m)  # rank among the chosen; m = not chosen
    positions = torch.arange(priority.shape[-1], device=priority.device).expand_as(slot)
    return slot.new_zeros(*slot.shape[:-1], m + 1).scatter_(-1, slot, positions)[..., :m]


def _top_by_sorting(priority: torch.Tensor, key_mask: torch.Tensor, m: int, force_cls: bool) -> torch.Tensor:
    """The positions :func:`_top` selects, by sorting (the fused forms, :mod:`attention.paths`), **in priority order**,
    not ascending (CUR does not depend on the order of its slots: reordering them permutes U's rows and columns, R's
    rows and C's columns alike, and the pseudo-inverse with them). Pads get −inf; NaN ranks above every number
    (sort's order; :func:`_top` ranks it as +inf, which differs only where NaN and +inf tie); with ``force_cls``
    index 0 becomes NaN, so it ranks first (ties among NaN break by lowest index).

    Spread over ``n``: a stable descending sort of each of ``c`` chunks of ``L`` positions
    (:func:`attention.landmark_stages.chunks`: ``B·H·c`` rows, two waves of a GPU; the last chunk padded with −inf
    past ``n``), their first ``m`` each, then a stable sort of those ``c·m`` candidates (independent of ``n``). A
    candidate list ordered chunk by chunk, each chunk by (priority descending, position ascending), sorts stably
    into the order one stable sort over ``n`` gives, so the result is the same (a pad ties at −inf with the masked
    tokens and follows them all, being last; with ``m ≤ n`` none is picked). One sort over ``n`` when a chunk would
    hold fewer than ``m`` positions."""
    priority = torch.where(key_mask[:, None, :], priority, -torch.inf)
    if force_cls:
        priority[..., 0] = torch.nan
    *rows, n = priority.shape
    c, length = landmark_stages.chunks(n, math.prod(rows))
    if length < m:
        return priority.sort(dim=-1, descending=True, stable=True).indices[..., :m]
    chunked = landmark_stages.chunked(priority[..., None], c, length, -torch.inf)[..., 0]  # (B, H, c, L)
    values, order = chunked.sort(dim=-1, descending=True, stable=True)
    starts = paths.chunk_starts(c, length, priority.device)  # (c, 1): each chunk's first position
    candidates = (order[..., :m] + starts).flatten(-2)  # (B, H, c·m) positions
    best = values[..., :m].flatten(-2).sort(dim=-1, descending=True, stable=True).indices[..., :m]
    return candidates.gather(-1, best)


@torch.no_grad()
def select_indices(
    q: torch.Tensor,
    k: torch.Tensor,
    key_mask: torch.Tensor | None,
    m: int,
    rule: str = "abs",
    same_indices: bool = True,
    embed_column: int = 0,
    force_cls: bool = False,
    generator: torch.Generator | None = None,
    form: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Query rows ``I`` and key rows ``J`` for CUR, each long ``(B, H, min(m, n))`` (see module doc).

    ``q``, ``k``: ``(B, H, n, d)``; ``key_mask``: bool ``(B, n)`` (True = real token) or None (all real).
    ``form`` (:mod:`attention.impl`): ``cpu`` (the C++ kernels where they take the rows), ``pytorch`` or ``fused``
    (by sorting, in priority order); None: :func:`default_form`.
    """
    form = form or default_form(q)
    check_selection(rule, embed_column)
    batch, heads, n, _ = q.shape
    if key_mask is None:
        key_mask = torch.ones(batch, n, dtype=torch.bool, device=q.device)
    m = min(m, n)
    priority = RULES[rule]
    options = dict(key_mask=key_mask, m=m, embed_column=embed_column, generator=generator, form=form)
    if form != "fused":  # the CPU forms rank float32 rows (its kernels' dtype); the fused forms read q, k as they are
        q, k = q.float(), k.float()
    if same_indices:
        index = _top(priority(q, **options) + priority(k, **options), key_mask, m, force_cls, form)
        index = index.expand(batch, heads, m)
        return index, index
    return (
        _top(priority(q, **options).expand(batch, heads, n), key_mask, m, force_cls, form),
        _top(priority(k, **options).expand(batch, heads, n), key_mask, m, force_cls, form),
    )
