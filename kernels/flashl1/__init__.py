"""FlashL1: exact L1-distance attention (EcoTransformer, Gao & Xu 2025, eq. 1) in fused Triton kernels.

* :mod:`kernels.flashl1.forward`: the forward kernel (online softmax) and the distance tiles.
* :mod:`kernels.flashl1.backward`: the gradient kernels, ``P`` recomputed tile by tile.
* :mod:`kernels.flashl1.launch`: launch parameters per GPU architecture and dtype (what
  ``tests/kernels/test_flashl1.py`` compiles) and the functions that launch the kernels.
* :mod:`kernels.flashl1.ops`: the autograd Function :class:`~kernels.flashl1.ops.FlashL1` and its checked entry
  point :func:`~kernels.flashl1.ops.flash_l1_attention` (what :mod:`attention.l1` calls).
* :mod:`kernels.flashl1.naive`: the plain PyTorch reference (the dense float64 formula).
"""
