"""Triton kernels (pure functions over tensors); the autograd wrappers live in :mod:`attention`.

* :mod:`kernels.flashcur` / :mod:`kernels.flashcur_bwd`: FlashCUR forward and backward (DESIGN §2).

Run on CUDA tensors, or on CPU with ``TRITON_INTERPRET=1`` set before a kernel module is imported.
"""
