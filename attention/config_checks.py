"""The checks every attention module runs on its config values at construction, so a bad value names its key
(``attention.<key>``) instead of failing inside torch. One module for every variant: no variant imports another
for a helper."""

from __future__ import annotations


def check_positive_int(value, key: str) -> int:
    """``value`` as an int >= 1, or a config error naming ``attention.<key>``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"attention.{key} must be an integer >= 1, got {value!r}")
    return value


def check_dropout(p: float, key: str = "dropout") -> float:
    """``p`` if it is a probability in [0, 1), else a config error naming ``attention.<key>``."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"attention.{key} must be in [0, 1), got {p}")
    return p


def check_choice(value, choices, key: str):
    """``value`` if it is one of ``choices``, else a config error naming ``attention.<key>`` and the choices."""
    if value not in choices:
        raise ValueError(f"attention.{key} must be one of {choices}, got {value!r}")
    return value
