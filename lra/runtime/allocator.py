"""Keep freed memory in the process instead of handing it back to the OS (glibc's ``mallopt``): for benchmarks.

PyTorch's CPU tensors come from ``malloc``. glibc serves a large block (above its mmap threshold, which adapts up
to 32 MiB) with a fresh ``mmap`` and trims the top of the heap once more than twice that threshold is free, so a
tensor of a few MiB freed at the end of one call is returned to the OS and the next call's tensor of the same size
is page-faulted in again, 4 KiB at a time. Attention benchmarks allocate the same sizes every call:
:func:`retain_freed_memory` (every ``lra.bench`` command) raises both thresholds so those blocks stay in the heap and
are reused. Measured: docs/bench.md, "L1-CUR on the landmark kernels, and an allocator that keeps freed memory". The
process keeps its peak heap for its lifetime. Other C libraries (macOS, musl) have no ``mallopt``: nothing changes
there.

Training does not call it. Batches trimmed to their longest sequence allocate other sizes every step; the freed
blocks of one step are too small for the next step's larger ones and cannot merge past the small blocks that live on
between them, so glibc's heap grows step after step while the memory in use stays flat, and with every block up to
256 MiB kept in the heap it grew faster still. Leaving glibc's thresholds alone costs the page faults of the largest
tensors every step: slower steps for a smaller heap; jemalloc gives both (docs/results.md, "Memory of CPU training
on batches of varying lengths": what was measured; docs/usage.md, "Memory of long CPU runs").
"""

from __future__ import annotations

import ctypes
import functools

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 << 20  # blocks up to 256 MiB from the heap (an n x n fp32 matrix at n = 8192 still mmaps)
TRIM_THRESHOLD = 1 << 30  # trim the heap's top only when more than 1 GiB of it is free


@functools.lru_cache(maxsize=None)
def retain_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (module doc) once per process; False where there is no ``mallopt``."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
