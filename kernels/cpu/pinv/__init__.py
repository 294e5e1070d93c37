"""The iterative pseudo-inverse's steps on the CPU: ``pinv.cpp`` and its bindings (:mod:`kernels.cpu.pinv.ops`); the
autograd node over them and the backend choice are the method's (:mod:`kernels.pinv.ops`); the plain PyTorch
reference: :mod:`kernels.cpu.pinv.naive`."""

from kernels.cpu.pinv.ops import STEP_MATRICES, iterate, iterate_backward, library, takes

__all__ = ["STEP_MATRICES", "iterate", "iterate_backward", "library", "takes"]
