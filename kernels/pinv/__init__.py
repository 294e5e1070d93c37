"""The iterative pseudo-inverse (Nyströmformer eq. 16) as two fused Triton kernels: all ``n_iter`` steps of an
``m × m`` problem in one program, forward and backward (docs/design.md §2 "Pseudo-inverse").

* :mod:`kernels.pinv.forward`: the init ``Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞)`` and the steps, one launch.
* :mod:`kernels.pinv.backward`: ``∂L/∂A`` through every step and the init's norms, one launch.
* :mod:`kernels.pinv.launch`: block size and warps per ``m`` (what ``tests/kernels/test_pinv_triton.py`` compiles).
* :mod:`kernels.pinv.ops`: the ``torch.library`` custom ops (``lra_pinv::*``, fake implementations,
  autograd) and :func:`~kernels.pinv.ops.fused_pinv`, what :func:`attention.pinv.iterative_pinv` calls on CUDA.
"""
