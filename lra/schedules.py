"""Learning-rate schedules built from ``configs/scheduler/*.yaml`` (``_partial_``: the optimizer is bound later)."""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, OneCycleLR


def check_steps(warmup_steps: int, total_steps: int) -> int:
    """Validate the step counts; return the warmup clipped to ``total_steps`` (short debug runs)."""
    if total_steps < 1 or warmup_steps < 0:
        raise ValueError(
            f"scheduler needs trainer.max_steps >= 1 and task.warmup_steps >= 0, got {total_steps}, {warmup_steps}"
        )
    return min(warmup_steps, total_steps)


def one_cycle(optimizer: Optimizer, max_lr: float, warmup_steps: int, total_steps: int, **kwargs) -> OneCycleLR:
    """:class:`torch.optim.lr_scheduler.OneCycleLR` as the Nyströmformer LRA code builds it
    (``LRA/code/run_tasks.py``): ``pct_start = warmup_steps / total_steps``; the other arguments
    (anneal strategy, div factors, β1 cycling) come from ``configs/scheduler/one_cycle.yaml``."""
    # OneCycleLR needs its decay phase (warmup < total) and spans warmup - 1 steps rising: 1 is none.
    warmup_steps = min(check_steps(warmup_steps, total_steps), total_steps - 1)
    if warmup_steps == 1:
        warmup_steps = 0
    return OneCycleLR(optimizer, max_lr=max_lr, total_steps=total_steps, pct_start=warmup_steps / total_steps, **kwargs)


def warmup_linear(optimizer: Optimizer, warmup_steps: int, total_steps: int) -> LambdaLR:
    """Linear warmup from 0 to the base lr over ``warmup_steps``, then linear decay to 0 at ``total_steps``."""
    warmup_steps = check_steps(warmup_steps, total_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return LambdaLR(optimizer, factor)
