"""Diagnostics behind docs/results.md: run each with ``python -m lra.analysis.diagnostics.<name> --help``."""
