"""C++ kernels for the CPU, one folder per method, built on first use and called through ``ctypes``.

* :mod:`kernels.cpu.build`: the one compiler driver (flags per instruction set, the cache keyed by source,
  headers and flags, the build-or-warn policy); ``simd.h`` (the vector type, loads, threads and prefetching every
  source shares) and ``landmarks.h`` (the landmark attention's tiles) sit here, on the include path;
  kernels/cpu/README.md says why ctypes and not ``torch.utils.cpp_extension``.
* ``kernels/cpu/<method>/``: the method's sources, ``ops.py`` (the bindings, the autograd nodes or custom op over
  them, and the one function per op that chooses between the kernel and the PyTorch form) and ``naive.py`` (the
  plain PyTorch reference its tests compare against):

  * :mod:`kernels.cpu.l1` (``l1.cpp``): exact L1-distance attention's distances and sign gradients
    (``L1Distance``, ``L1AttentionFunction``; ``uses_kernel``);
  * :mod:`kernels.cpu.landmarks` (``landmarks.cpp``, ``landmarks_backward.cpp``): softmax or L1-score attention
    with a few keys or a few queries, forward and backward (``attend``; ``kernel_for``);
  * :mod:`kernels.cpu.cur`: CUR's training step on the landmark kernels as one node (``CURKernelAttention``;
    ``takes``);
  * :mod:`kernels.cpu.selection` (``selection.cpp``): CUR's landmark priorities and top indices;
  * :mod:`kernels.cpu.seqconv` (``seqconv.cpp``): Nyström's depthwise sequence conv and segment sums
    (``ConvFunction``, ``SegmentSums``; ``uses_kernel``);
  * :mod:`kernels.cpu.dropout` (``dropout.cpp``): dropout by a hash of (seed, index), the custom op
    ``lra::dropout`` (``takes``).

* :mod:`kernels.cpu.pinv` (``pinv/pinv.cpp``): the iterative pseudo-inverse's steps and their backward.

Nothing here imports ``attention`` or ``models`` (import-linter): a method passes in what a node needs of it (CUR's
score and pseudo-inverse).
"""
