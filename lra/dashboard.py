"""``python -m lra.dashboard``: the W&B dashboard lives in :mod:`lra.analysis.dashboard` (run that, or this)."""

from lra.analysis.dashboard import main

if __name__ == "__main__":
    raise SystemExit(main())
