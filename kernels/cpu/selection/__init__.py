"""CUR's landmark selection on the CPU: ``selection.cpp`` and its bindings (:mod:`kernels.cpu.selection.ops`), the
plain PyTorch reference (:mod:`kernels.cpu.selection.naive`)."""

from kernels.cpu.selection.ops import abs_row_sums, top_indices

__all__ = ["abs_row_sums", "top_indices"]
