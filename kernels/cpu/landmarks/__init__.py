"""Landmark attention (few keys or few queries) on the CPU: ``landmarks.cpp``, ``landmarks_backward.cpp`` (and the
shared ``kernels/cpu/landmarks.h``), their bindings, autograd node and op (:mod:`kernels.cpu.landmarks.ops`), the
plain PyTorch reference (:mod:`kernels.cpu.landmarks.naive`)."""

from kernels.cpu.landmarks.ops import MAX_KEYS, attend, kernel_for, kernel_takes, vector_floats

__all__ = ["MAX_KEYS", "attend", "kernel_for", "kernel_takes", "vector_floats"]
