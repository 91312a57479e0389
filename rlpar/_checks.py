"""The small checks every layer of the Python package shares, so that every message reads
the same way: ``<what>: expected <expected>, got <given>`` and one "did you mean"."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from numbers import Integral
from typing import Any

__all__ = ["check_int", "did_you_mean"]


def did_you_mean(given: object, choices: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to ``given`` (with ``prefix``
    in front of the suggestion, e.g. a config section), or "" when none is close."""
    close = difflib.get_close_matches(str(given), list(choices), n=1)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


def check_int(
    name: str,
    value: Any,
    minimum: int | None = None,
    maximum: int | None = None,
    error: type[Exception] = ValueError,
) -> int:
    """``value`` as an int, if it is an integer (bool is not) within [minimum, maximum]; else
    TypeError (not an integer) or ``error`` (out of range), naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    low = minimum is None or value >= minimum
    high = maximum is None or value <= maximum
    if not (low and high):
        if maximum is None:
            expected = f"an integer >= {minimum}"
        elif minimum is None:
            expected = f"an integer <= {maximum}"
        else:
            expected = f"an integer from {minimum} to {maximum}"
        raise error(f"{name}: expected {expected}, got {value!r}")
    return int(value)
