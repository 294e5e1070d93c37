"""`lra.runtime.allocator.retain_freed_memory`: with it, a 64 MiB tensor comes from the heap instead of its own ``mmap``
(glibc's ``mallinfo2().hblks`` counts the mmapped blocks), so freeing it keeps the memory for the next one."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

PROBE = """
import ctypes, sys
import torch
from lra.runtime.allocator import retain_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
if sys.argv[1] == "retain":
    assert retain_freed_memory()
before = mallinfo2().hblks
x = torch.empty(16 << 20)  # 64 MiB
print(mallinfo2().hblks - before)
"""


def mmapped_blocks_for_a_64_mib_tensor(mode: str) -> int:
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(result.stdout.split()[-1])


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="not glibc >= 2.33 (no mallinfo2)")
def test_large_tensors_come_from_the_heap():
    assert mmapped_blocks_for_a_64_mib_tensor("default") == 1  # glibc's own threshold: a fresh mmap
    assert mmapped_blocks_for_a_64_mib_tensor("retain") == 0
