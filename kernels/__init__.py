"""The kernels, pure functions over tensors, by device and by method (the methods that call them: ``attention/``).

* :mod:`kernels.cpu`: every C++ kernel for the CPU (L1, landmarks, selection, pseudo-inverse, sequence conv,
  dropout), one build module and one SIMD header (kernels/cpu/README.md).
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
* :mod:`kernels.pinv`: the iterative pseudo-inverse (docs/design.md §2 "Pseudo-inverse") — ``forward`` and
  ``backward`` kernels (all ``n_iter`` steps of a matrix in one program), ``launch`` and ``ops``: the custom ops
  ``lra_pinv::forward`` / ``lra_pinv::backward`` and :func:`kernels.pinv.ops.fused_pinv` (what
  :func:`attention.pinv.iterative_pinv` calls on CUDA).

The Triton kernels run on CUDA tensors, or on CPU with ``TRITON_INTERPRET=1`` set before a kernel module is
imported.
"""
