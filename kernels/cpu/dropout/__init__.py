"""Dropout by a hash of (seed, index) on the CPU: ``dropout.cpp``, its binding and the custom op ``lra::dropout``
(:mod:`kernels.cpu.dropout.ops`), the plain PyTorch reference (:mod:`kernels.cpu.dropout.naive`)."""

from kernels.cpu.dropout.ops import dropout, takes

__all__ = ["dropout", "takes"]
