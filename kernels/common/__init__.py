"""What both kernel families share: :mod:`kernels.common.launch` (launch parameters' building blocks,
the interpreter switch, the launch) and :mod:`kernels.common.aot` (ahead-of-time compilation); :mod:`kernels.common.precision` (autocast off, for the
float32 regions of the ops and of :mod:`attention`)."""
