"""Argument checks of the training entry points (:func:`robustest.train.harden` and its objectives): numbers and
counts with one-line :class:`ConfigError` messages naming the argument."""

from __future__ import annotations

import math
from typing import Any

from robustest.core.errors import ConfigError

__all__ = ["check_count", "check_number"]


def check_number(v: Any, name: str, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
                 hint: str = "") -> float:
    """``v`` as a finite float in [lo, hi] (``(lo, hi]`` with ``lo_open``); ConfigError otherwise."""
    if isinstance(v, bool):
        raise ConfigError(f"{name} must be a number, got {v!r}")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {v!r}") from None
    if not math.isfinite(f):
        raise ConfigError(f"{name} must be a finite number, got {v!r}{hint}")
    if lo is not None and (f < lo or (lo_open and f == lo)) or hi is not None and f > hi:
        left = "(" if lo_open else "["
        rng = f"{left}{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise ConfigError(f"{name} must lie in {rng}, got {v!r}{hint}")
    return f


def check_count(v: Any, name: str, minimum: int = 1) -> int:
    """``v`` as an integer >= ``minimum`` (booleans refused); ConfigError otherwise."""
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)
