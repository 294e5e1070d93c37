"""FlashL1: exact L1-distance attention (EcoTransformer, Gao & Xu 2025, eq. 1) in fused Triton kernels.

* :mod:`kernels.flashl1.forward`: the forward kernel (online softmax) and the distance tiles.
* :mod:`kernels.flashl1.backward`: the gradient kernels, ``P`` recomputed tile by tile.
* :mod:`kernels.flashl1.launch`: launch parameters per GPU architecture and dtype (what
  ``tests/kernels/test_flashl1.py`` compiles), the functions that launch the kernels, and the autograd
  wrapper :func:`~kernels.flashl1.launch.flash_l1_attention` that :mod:`attention.l1` calls.
"""
