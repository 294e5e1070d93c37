"""Learning-rate schedules built from ``configs/scheduler/*.yaml`` (``_partial_``: the optimizer is bound later)."""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def warmup_linear(optimizer: Optimizer, warmup_steps: int, total_steps: int) -> LambdaLR:
    """Linear warmup from 0 to the base lr over ``warmup_steps``, then linear decay to 0 at ``total_steps``."""
    if total_steps < 1 or warmup_steps < 0:
        raise ValueError(f"scheduler needs total_steps >= 1 and warmup_steps >= 0, got {total_steps}, {warmup_steps}")
    warmup_steps = min(warmup_steps, total_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return LambdaLR(optimizer, factor)
