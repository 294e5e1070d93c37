"""CUR's training path on the CPU's landmark kernels as one autograd node (:mod:`kernels.cpu.cur.ops`; no source of
its own: it chains ``landmarks/``), the plain PyTorch reference (:mod:`kernels.cpu.cur.naive`)."""

from kernels.cpu.cur.ops import CURKernelAttention, takes

__all__ = ["CURKernelAttention", "takes"]
