"""The iterative pseudo-inverse (Nyströmformer eq. 16): fused Triton kernels (all ``n_iter`` steps of an ``m × m``
problem in one program, forward and backward), a C++ kernel for the CPU and the PyTorch form (docs/design.md §2
"Pseudo-inverse").

* :mod:`kernels.pinv.forward`: the init ``Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞)`` and the steps, one launch.
* :mod:`kernels.pinv.backward`: ``∂L/∂A`` through every step and the init's norms, three launches (each step's
  terms recomputed from the kept iterates, all steps at once; the serial chain; the sum of ``∂A``'s terms).
* :mod:`kernels.pinv.launch`: block size and warps per ``m`` (what ``tests/kernels/test_pinv_triton.py`` compiles),
  the launch.
* :mod:`kernels.pinv.ops`: the ``torch.library`` custom ops (``lra_pinv::*``, fake implementations, autograd, FLOP
  formulas) and their checked entry point :func:`~kernels.pinv.ops.fused_pinv`; :func:`~kernels.pinv.ops.pinv`, which
  runs the form it is given; the PyTorch form's autograd (:class:`~kernels.pinv.ops.Iterations`, over the C++ kernel
  where asked). :func:`attention.pinv.iterative_pinv` checks the arguments and calls it.
* ``cpu.cpp`` and :mod:`kernels.pinv.cpu`: the steps and their backward on the CPU, and their bindings.
* :mod:`kernels.pinv.naive`: the one plain PyTorch reference (matrix by matrix in float64; the steps as written).
"""
