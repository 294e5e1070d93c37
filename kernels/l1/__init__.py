"""Exact L1-distance attention's kernels (EcoTransformer, Gao & Xu 2025, eq. 1): FlashL1 in Triton and the C++
kernels for the CPU.

* :mod:`kernels.l1.forward`: the forward kernel (online softmax) and the distance tiles.
* :mod:`kernels.l1.backward`: the gradient kernels, ``P`` recomputed tile by tile.
* :mod:`kernels.l1.launch`: launch parameters per GPU architecture and dtype (what
  ``tests/kernels/test_flashl1.py`` compiles) and the functions that launch the kernels.
* :mod:`kernels.l1.ops`: the autograd Function :class:`~kernels.l1.ops.FlashL1` and its checked entry
  point :func:`~kernels.l1.ops.flash_l1_attention` (what :mod:`attention.l1` calls).
* ``cpu.cpp`` and :mod:`kernels.l1.cpu`: the distances and sign gradients on the CPU, their bindings and the autograd
  nodes ``L1Distance`` and ``L1AttentionFunction``.
* :mod:`kernels.l1.naive`: the one plain PyTorch reference (the dense float64 formula, distances and weights).
"""
