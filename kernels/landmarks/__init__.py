"""Nyströmformer's landmarks (segment means of Q and K over real tokens) in Triton kernels.

* :mod:`kernels.landmarks.segments`: the forward kernel (both means, each segment's count, its additive mask and
  validity, each token's segment) and the backward kernel (each token's gradient from its segment's).
* :mod:`kernels.landmarks.launch`: launch parameters per shape (what ``tests/kernels/test_landmark_kernels.py`` compiles
  for sm_80 / sm_90) and the functions that launch the kernels.
* :mod:`kernels.landmarks.ops`: the custom operators ``lra_nystrom::*`` (fake implementations, autograd, FLOP
  formulas) and :func:`~kernels.landmarks.ops.takes`, whether they run on given inputs;
  :mod:`attention.landmark_means` calls them.
* :mod:`kernels.landmarks.naive`: the plain PyTorch reference (segments and their means).
"""
