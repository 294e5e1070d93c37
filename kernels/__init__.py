"""Triton kernels: one sub-package per method, and the launch machinery they share.

* :mod:`kernels.common`: what both families launch with — :mod:`kernels.common.launch` (shared memory
  per GPU architecture and its estimate, pointer types, the interpreter switch, the shared ``tl.dot``,
  the launch itself) and :mod:`kernels.common.aot` (ahead-of-time compilation for sm_80 / sm_90
  without a GPU).
* :mod:`kernels.flashcur`: FlashCUR (docs/design.md §2 "FlashCUR") — ``forward`` and ``backward``
  kernels, ``launch`` (launch parameters per architecture) and ``ops`` (the functions that launch
  them). Its autograd wrappers live in :mod:`attention.flashcur`.
* :mod:`kernels.flashl1`: FlashL1, exact L1-distance attention (EcoTransformer) — ``forward`` and
  ``backward`` kernels and ``launch``: launch parameters, the functions that launch them, and its
  autograd wrapper, :func:`kernels.flashl1.launch.flash_l1_attention` (what :mod:`attention.l1` calls).

Run on CUDA tensors, or on CPU with ``TRITON_INTERPRET=1`` set before a kernel module is imported.
"""
