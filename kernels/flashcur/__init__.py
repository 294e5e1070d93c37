"""FlashCUR (François et al. 2025, §5.2, Alg. 2): CUR attention in fused Triton kernels.

* :mod:`kernels.flashcur.forward`: kernels (a) ``RV``, (b) ``U``, (c) the output.
* :mod:`kernels.flashcur.backward`: their gradients, ``R`` and ``C`` recomputed tile by tile.
* :mod:`kernels.flashcur.launch`: launch parameters per GPU architecture, dtype and shape (what
  ``tests/kernels/test_aot_compile.py`` compiles), the launch, and one function per kernel (pair) that allocates,
  launches (n split over a grid axis for the kernels whose programs walk all n tokens) and merges the split partials.
* :mod:`kernels.flashcur.ops`: the ``torch.library`` custom ops ``lra_flashcur::*`` over those functions (fake
  implementations, autograd, FLOP formulas); :mod:`attention.flashcur` chains them.
* :mod:`kernels.flashcur.naive`: the plain PyTorch reference (each kernel's equation, the dense layer).
"""
