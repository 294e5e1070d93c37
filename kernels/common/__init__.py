"""What both kernel families share: :mod:`kernels.common.launch` (launch parameters' building blocks,
the interpreter switch, the launch) and :mod:`kernels.common.aot` (ahead-of-time compilation)."""
