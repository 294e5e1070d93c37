"""Triton kernels (pure functions over tensors); the autograd wrappers live in :mod:`attention`.

* :mod:`kernels.flashcur` / :mod:`kernels.flashcur_bwd`: FlashCUR forward and backward (docs/design.md §2 "FlashCUR").
* :mod:`kernels.launch`: every launch parameter (tiles, warps, stages) per GPU architecture, shared by
  the wrappers and :mod:`kernels.aot` (ahead-of-time compilation for sm_80 / sm_90 without a GPU).

Run on CUDA tensors, or on CPU with ``TRITON_INTERPRET=1`` set before a kernel module is imported.
"""
