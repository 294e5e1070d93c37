"""What the kernels share: :mod:`kernels.common.launch` (launch parameters' building blocks, the interpreter switch,
the launch) and :mod:`kernels.common.aot` (ahead-of-time compilation) for the Triton kernels;
:mod:`kernels.common.build` (the one C++ compiler driver and cache) with the headers every C++ source may include
(``simd.h``, ``landmark_attention.h``); :mod:`kernels.common.precision` (autocast off, for the float32 regions of the
ops and of :mod:`attention`) and :mod:`kernels.common.rows` (the selected rows CUR and its kernels' autograd formulas
gather)."""
