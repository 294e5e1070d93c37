"""Nyström's depthwise sequence conv and segment sums on the CPU: ``cpu.cpp``, its bindings and autograd nodes
(:mod:`kernels.seqconv.cpu`), the plain PyTorch reference (:mod:`kernels.seqconv.naive`)."""

from kernels.seqconv.cpu import ConvFunction, SegmentSums, uses_kernel

__all__ = ["ConvFunction", "SegmentSums", "uses_kernel"]
