"""`lra.runtime.allocator.retain_freed_memory`: with it, a 64 MiB tensor comes from the heap instead of its own ``mmap``
(glibc's ``mallinfo2().hblks`` counts the mmapped blocks), so freeing it keeps the memory for the next one. Benchmarks
call it; training does not: on batches of varying lengths a heap that keeps every block grows step after step
(docs/results.md, "Memory of CPU training on batches of varying lengths"). Each probe runs in a fresh process, whose
thresholds are its own."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

MALLINFO = """
import ctypes, sys
import torch

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2

def mmapped_blocks_for_a_64_mib_tensor():
    before = mallinfo2().hblks
    x = torch.empty(16 << 20)  # 64 MiB
    return mallinfo2().hblks - before
"""

PROBE = MALLINFO + """
from lra.runtime.allocator import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory()
print(mmapped_blocks_for_a_64_mib_tensor())
"""

# A few training steps through the real entry point (lra.train's main, in the probe's process), then the probe.
AFTER_TRAINING = MALLINFO + """
from lra.train import main
sys.argv = ["lra.train", *sys.argv[1:]]
try:
    main()
except SystemExit as stop:
    assert not stop.code, stop.code
print(mmapped_blocks_for_a_64_mib_tensor())
"""

glibc = pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="not glibc >= 2.33 (no mallinfo2)")


def mmapped_blocks(script: str, *args: str) -> int:
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return int(result.stdout.split()[-1])


@glibc
def test_large_tensors_come_from_the_heap():
    assert mmapped_blocks(PROBE, "default") == 1  # glibc's own threshold: a fresh mmap
    assert mmapped_blocks(PROBE, "retain") == 0


@glibc
def test_training_leaves_glibc_thresholds_alone(tiny_listops_overrides, tmp_path):
    """After ``lra.train`` a 64 MiB tensor still gets its own ``mmap`` (glibc's adaptive threshold stops at 32 MiB):
    training did not raise the thresholds, so large freed blocks go back to the OS instead of fragmenting the heap."""
    assert mmapped_blocks(AFTER_TRAINING, *tiny_listops_overrides, f"hydra.run.dir={tmp_path / 'run'}") == 1
