"""Lightning callbacks specific to attention variants (configs/callbacks/*.yaml)."""

from __future__ import annotations

import lightning as L
import torch

GATE_BUFFER = "memory_gate"  # name of the μ buffer of attention.liza.LiZAAttention (scheduled gate)


class MemoryGateSchedule(L.Callback):
    """LiZA's memory-as-gate schedule (TPTT §4.2): μ ramps linearly ``start → end`` over ``ramp_steps``
    optimizer steps, then stays at ``end``.

    ``μ(step) = start + (end − start) · min(step, ramp_steps) / ramp_steps`` (``ramp_steps = 0``: ``end``
    from the start; ``start = end``: a constant μ). Before every training batch it writes μ(global_step)
    into every module's ``memory_gate`` buffer and logs it as ``train/mag``. Modules without that buffer
    (other variants, LiZA with a learned gate) are left alone, so the callback is a no-op for them.
    """

    def __init__(self, start: float = 0.01, end: float = 0.5, ramp_steps: int = 100):
        if not (0.0 <= start <= 1.0 and 0.0 <= end <= 1.0):
            raise ValueError(f"callbacks.memory_gate.start/end must lie in [0, 1], got {start}, {end}")
        if ramp_steps < 0:
            raise ValueError(f"callbacks.memory_gate.ramp_steps must be >= 0, got {ramp_steps}")
        self.start = start
        self.end = end
        self.ramp_steps = ramp_steps

    def value_at(self, step: int) -> float:
        """μ after ``step`` optimizer steps."""
        if self.ramp_steps == 0:
            return self.end
        return self.start + (self.end - self.start) * min(step, self.ramp_steps) / self.ramp_steps

    @staticmethod
    def gates(module: torch.nn.Module) -> list[torch.Tensor]:
        """Every ``memory_gate`` buffer under ``module``."""
        return [buffers[GATE_BUFFER] for m in module.modules() if GATE_BUFFER in (buffers := dict(m.named_buffers(recurse=False)))]

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        gates = self.gates(pl_module)
        if not gates:
            return
        mu = self.value_at(trainer.global_step)
        for gate in gates:
            gate.fill_(mu)
        pl_module.log("train/mag", mu, on_step=True, on_epoch=False)
