"""Diagnostics behind docs/results.md: run each with ``python -m lra.diagnostics.<name> --help``."""
