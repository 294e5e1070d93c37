"""Nyström's depthwise sequence conv and segment sums on the CPU: ``seqconv.cpp``, its bindings and autograd nodes
(:mod:`kernels.cpu.seqconv.ops`), the plain PyTorch reference (:mod:`kernels.cpu.seqconv.naive`)."""

from kernels.cpu.seqconv.ops import ConvFunction, SegmentSums, uses_kernel

__all__ = ["ConvFunction", "SegmentSums", "uses_kernel"]
