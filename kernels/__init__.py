"""The kernels, pure functions over tensors, by device and by method (the methods that call them: ``attention/``).

* :mod:`kernels.cpu`: every C++ kernel for the CPU (L1, landmarks, selection, pseudo-inverse, sequence conv,
  dropout), one build module and one SIMD header (kernels/cpu/README.md).
* :mod:`kernels.common`: what both families launch with — :mod:`kernels.common.launch` (shared memory
  per GPU architecture and its estimate, pointer types, the interpreter switch, the shared ``tl.dot``,
  the launch itself), :mod:`kernels.common.aot` (ahead-of-time compilation for sm_80 / sm_90
  without a GPU), and what the methods share with the ops: :mod:`kernels.common.precision` (autocast off),
  :mod:`kernels.common.rows` (gathering the selected rows).
* :mod:`kernels.flashcur`, :mod:`kernels.flashl1`, :mod:`kernels.landmarks`, :mod:`kernels.pinv`: one folder per
  Triton method (FlashCUR, docs/design.md §2 "FlashCUR"; FlashL1, exact L1-distance attention (EcoTransformer);
  Nyströmformer's landmarks; the iterative pseudo-inverse, docs/design.md §2 "Pseudo-inverse"), each laid out
  alike: ``forward`` / ``backward`` (or ``segments``) the ``@triton.jit`` kernels, ``launch`` the launch parameters
  per architecture, shape and dtype and the functions that allocate and launch, ``ops`` the ``torch.library``
  custom ops or autograd Functions over them (fake implementations, autograd, FLOP formulas; the pseudo-inverse's
  also the one choice of its form, :func:`kernels.pinv.ops.backend`), ``naive`` the plain PyTorch reference the
  tests compare them with. :mod:`attention` calls the ops, never the launches.

The Triton kernels run on CUDA tensors, or on CPU with ``TRITON_INTERPRET=1`` set before a kernel module is
imported.
"""
