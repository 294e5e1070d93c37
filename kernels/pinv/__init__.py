"""The iterative pseudo-inverse (Nyströmformer eq. 16) as two fused Triton kernels: all ``n_iter`` steps of an
``m × m`` problem in one program, forward and backward (docs/design.md §2 "Pseudo-inverse").

* :mod:`kernels.pinv.forward`: the init ``Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞)`` and the steps, one launch.
* :mod:`kernels.pinv.backward`: ``∂L/∂A`` through every step and the init's norms, one launch.
* :mod:`kernels.pinv.launch`: block size and warps per ``m`` (what ``tests/kernels/test_pinv_triton.py`` compiles),
  the launch.
* :mod:`kernels.pinv.ops`: the one choice of the form (:func:`~kernels.pinv.ops.backend`: Triton, the C++ CPU kernel
  of :mod:`kernels.cpu.pinv`, or PyTorch) and :func:`~kernels.pinv.ops.pinv`, which runs it; the ``torch.library``
  custom ops (``lra_pinv::*``, fake implementations, autograd, FLOP formulas) and their checked entry point
  :func:`~kernels.pinv.ops.fused_pinv`; the PyTorch form's autograd (:class:`~kernels.pinv.ops.Iterations`, over the
  C++ kernel where it takes the operands). :func:`attention.pinv.iterative_pinv` checks the arguments and calls it.
* :mod:`kernels.pinv.naive`: the plain PyTorch reference (matrix by matrix in float64).
"""
