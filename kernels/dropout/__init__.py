"""Dropout by a hash of (seed, index) on the CPU: ``cpu.cpp``, its binding and the custom op ``lra::dropout``
(:mod:`kernels.dropout.cpu`), the plain PyTorch reference (:mod:`kernels.dropout.naive`)."""

from kernels.dropout.cpu import dropout, takes

__all__ = ["dropout", "takes"]
