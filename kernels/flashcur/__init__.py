"""FlashCUR (François et al. 2025, §5.2, Alg. 2): CUR attention in fused Triton kernels.

* :mod:`kernels.flashcur.forward`: kernels (a) ``RV``, (b) ``U``, (c) the output.
* :mod:`kernels.flashcur.backward`: their gradients, ``R`` and ``C`` recomputed tile by tile.
* :mod:`kernels.flashcur.launch`: launch parameters per GPU architecture, dtype and shape (what
  ``tests/kernels/test_aot_compile.py`` compiles), and the launch.
* :mod:`kernels.flashcur.ops`: one function per kernel (pair) that allocates, launches (n split over a grid
  axis for the kernels whose programs walk all n tokens) and merges the split partials; the
  custom ops (fake implementations, autograd) that chain them live in :mod:`attention.flashcur`.
"""
