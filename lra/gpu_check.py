"""``python -m lra.gpu_check`` keeps working: the GPU check lives in :mod:`lra.bench.gpu_check`."""

from lra.bench.gpu_check import main

if __name__ == "__main__":
    raise SystemExit(main())
