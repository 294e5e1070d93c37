"""C++ kernels for the CPU, one source per method, built on first use and called through ``ctypes``.

* :mod:`kernels.cpu.build`: the one compiler driver (flags per instruction set, the cache keyed by source,
  headers and flags, the build-or-warn policy); ``simd.h``: the vector type, loads, threads and prefetching
  every source shares; kernels/cpu/README.md says why ctypes and not ``torch.utils.cpp_extension``.
* :mod:`kernels.cpu.l1` (``l1.cpp``): exact L1-distance attention's distances and sign gradients.
* :mod:`kernels.cpu.landmarks` (``landmarks.cpp``, ``landmarks_backward.cpp``, ``landmarks.h``): softmax or
  L1-score attention with a few keys or a few queries, forward and backward.
* :mod:`kernels.cpu.selection` (``selection.cpp``): CUR's landmark priorities and top indices.
* :mod:`kernels.cpu.pinv` (``pinv.cpp``): the iterative pseudo-inverse's steps and their backward.
* :mod:`kernels.cpu.seqconv` (``seqconv.cpp``): Nyström's depthwise sequence conv and segment sums.
* :mod:`kernels.cpu.dropout` (``dropout.cpp``): dropout by a hash of (seed, index).

Each module binds its library's functions to tensors (pointers, strides, shapes); the autograd nodes that
chain them live with the methods in ``attention/`` (``*_cpu.py``) and ``models/dropout.py``.
"""
