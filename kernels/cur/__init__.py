"""CUR attention's kernels (François et al. 2025; docs/design.md §2 "CURformer", "FlashCUR"): FlashCUR's Triton
kernels (§5.2, Alg. 2) and the CPU training node over the landmark-attention kernels.

* :mod:`kernels.cur.forward`: kernels (a) ``RV``, (b) ``U``, (c) the output.
* :mod:`kernels.cur.backward`: their gradients, ``R`` and ``C`` recomputed tile by tile.
* :mod:`kernels.cur.launch`: launch parameters per GPU architecture, dtype and shape (what
  ``tests/kernels/test_aot_compile.py`` compiles), the launch, and one function per kernel (pair) that allocates,
  launches (n split over a grid axis for the kernels whose programs walk all n tokens) and merges the split partials;
  :mod:`kernels.cur.run` the launches' shared steps; :mod:`kernels.cur.merge` the merge of kernel (a)'s splits, one
  kernel.
* :mod:`kernels.cur.ops`: the ``torch.library`` custom ops ``lra_flashcur::*`` over those functions (fake
  implementations, autograd, FLOP formulas); :mod:`attention.flashcur` chains them.
* :mod:`kernels.cur.cpu`: CUR's training step on the CPU as one autograd node (``CURKernelAttention``) over the C++
  kernels of :mod:`kernels.landmark_attention` (no C++ source of its own).
* :mod:`kernels.cur.naive`: the one plain PyTorch reference (each kernel's equation, the dense layer, the CPU node's
  equations).
"""
