"""Exact L1-distance attention on the CPU: ``l1.cpp``, its bindings and autograd nodes (:mod:`kernels.cpu.l1.ops`), the
plain PyTorch reference (:mod:`kernels.cpu.l1.naive`)."""

from kernels.cpu.l1.ops import L1AttentionFunction, L1Distance, uses_kernel

__all__ = ["L1AttentionFunction", "L1Distance", "uses_kernel"]
