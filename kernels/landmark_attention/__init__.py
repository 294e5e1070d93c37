"""Landmark attention on the CPU: softmax or L1-score attention where one side is a few (≤ 128) landmarks, the
products CUR and Nyström share (``C W``, ``R V``, ``k₃ V``). ``cpu.cpp``, ``cpu_backward.cpp`` (with the shared
``kernels/common/landmark_attention.h``, which the selection and pseudo-inverse sources include too), their bindings,
autograd node and op (:mod:`kernels.landmark_attention.cpu`), the plain PyTorch reference
(:mod:`kernels.landmark_attention.naive`)."""

from kernels.landmark_attention.cpu import MAX_KEYS, attend, kernel_for, kernel_takes, vector_floats

__all__ = ["MAX_KEYS", "attend", "kernel_for", "kernel_takes", "vector_floats"]
