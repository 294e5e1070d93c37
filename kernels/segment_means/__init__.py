"""Nyströmformer's landmarks (segment means of Q and K over real tokens) in Triton kernels (their CPU form, the
segment sums in C++, shares ``kernels/seqconv/cpu.cpp`` with Nyström's conv: :mod:`kernels.seqconv`).

* :mod:`kernels.segment_means.forward`: the forward kernel (both means, each segment's count, its additive mask and
  validity, each token's segment); :mod:`kernels.segment_means.backward`: the backward kernel (each token's gradient
  from its segment's).
* :mod:`kernels.segment_means.launch`: launch parameters per shape (what ``tests/kernels/test_segment_means.py``
  compiles for sm_80 / sm_90) and the functions that launch the kernels.
* :mod:`kernels.segment_means.ops`: the custom operators ``lra_nystrom::*`` (fake implementations, autograd, FLOP
  formulas) and :func:`~kernels.segment_means.ops.takes`, whether they take given inputs;
  :mod:`attention.landmark_means` calls them.
* :mod:`kernels.segment_means.naive`: the plain PyTorch reference (segments and their means).
"""
