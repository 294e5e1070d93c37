"""CUR's landmark selection on the CPU: ``cpu.cpp`` and its bindings (:mod:`kernels.selection.cpu`), the
plain PyTorch reference (:mod:`kernels.selection.naive`)."""

from kernels.selection.cpu import abs_row_sums, top_indices

__all__ = ["abs_row_sums", "top_indices"]
