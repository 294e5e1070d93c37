"""``python -m lra.report`` keeps working: the report lives in :mod:`lra.analysis.report` (run that, or ``lra-report``)."""

from lra.analysis.report import main

if __name__ == "__main__":
    raise SystemExit(main())
