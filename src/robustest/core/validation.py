"""One validation layer for every value a user gives: CLI flags, YAML keys and Python keyword arguments.

Each check takes the value and the name the user knows it by (``--eps``, ``eps``), returns the value in
its canonical type, and raises :class:`ConfigError` with one line naming the value, what is allowed and
the value given. Numbers must be finite (NaN and infinities are refused everywhere), integers must be
integers (a YAML ``3.0`` or ``true`` is not an integer), booleans must be booleans (a YAML ``"no"`` is a
string, not false), paths must be strings. The CLI's argparse types come from the same checks
(:func:`arg`), so a flag and the matching YAML key or keyword argument accept exactly the same values.
"""

from __future__ import annotations

import argparse
import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction
from typing import Any

from robustest.core.errors import ConfigError

__all__ = [
    "arg",
    "check_bool",
    "check_choice",
    "check_eps",
    "check_float",
    "check_int",
    "check_keywords",
    "check_seed",
    "check_str",
    "parse_number",
]

MAX_EPOCHS = 100_000
MAX_L2_RADIUS = 1000.0  # an L2 (or L1) radius beyond this is no bound at all on [0, 1] images of any common size
MAX_SEED = 2**63  # seeds lie in [0, 2^63): what torch.Generator.manual_seed takes
#: the largest magnitude a float flag accepts: beyond it, products with float32 tensors overflow to inf/NaN
MAX_MAGNITUDE = 1e9


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None, *,
              allow_none: bool = False) -> int | None:
    """An integer in [lo, hi] (bounds optional); NumPy integers accepted, floats and booleans refused."""
    if value is None and allow_none:
        return None
    if hasattr(value, "item") and not isinstance(value, (int, float)) and getattr(value, "ndim", 1) == 0:
        value = value.item()  # NumPy scalars, 0-d tensors
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer{_range(lo, hi)}, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ConfigError(f"{name} must be an integer{_range(lo, hi)}, got {value}")
    return int(value)


def check_seed(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """A seed: an integer in [0, 2^63) (``--seed``, ``--seeds``, the YAML ``seed`` and ``seeds`` alike)."""
    if value is None and allow_none:
        return None
    if hasattr(value, "item") and not isinstance(value, (int, float)) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_SEED:
        raise ConfigError(f"{name} must be a seed: an integer in [0, 2^63), got {value!r}")
    return int(value)


def check_float(name: str, value: Any, lo: float | None = None, hi: float | None = None, *,
                lo_open: bool = False, hi_open: bool = False, allow_none: bool = False) -> float | None:
    """A finite number in the interval (``lo_open``/``hi_open`` exclude the ends)."""
    if value is None and allow_none:
        return None
    if hasattr(value, "item") and not isinstance(value, (int, float)) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if not _num(value):
        raise ConfigError(f"{name} must be a number{_interval(lo, hi, lo_open, hi_open)}, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(f"{name} must be a finite number{_interval(lo, hi, lo_open, hi_open)}, got {value}")
    if lo is not None and (v < lo or (lo_open and v == lo)) or hi is not None and (v > hi or (hi_open and v == hi)):
        raise ConfigError(f"{name} must be a number{_interval(lo, hi, lo_open, hi_open)}, got {value}")
    return v


def check_bool(name: str, value: Any, *, allow_none: bool = False) -> bool | None:
    """``True`` or ``False`` only (YAML ``true``/``false``): strings such as ``"no"`` are refused."""
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    return value


def check_str(name: str, value: Any, *, allow_none: bool = False, what: str = "a string") -> str | None:
    """A non-empty string (a path, a name)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{name} must be {what}, got {value!r}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[str], *, allow_none: bool = False) -> str | None:
    """One of ``choices``."""
    if value is None and allow_none:
        return None
    options = list(choices)
    if not isinstance(value, str) or value not in options:
        raise ConfigError(f"unknown {name} {value!r}: choose one of {', '.join(options)}")
    return value


def check_eps(name: str, value: Any, norm: str = "linf", *, allow_none: bool = False) -> float | None:
    """A perturbation radius in pixel scale (images in [0, 1]): L-inf in (0, 1]; L2 and L1 in
    (0, :data:`MAX_L2_RADIUS`]. The one check of a radius, whether it comes from a flag (``--eps 8/255``, see
    :func:`parse_number`), a YAML key or a keyword argument (``attacks.pgd(..., eps=8)`` is refused with the
    same line as ``robustest eval --eps 8``)."""
    if value is None and allow_none:
        return None
    n = str(norm).lower().replace("-", "")
    n = "linf" if n in ("inf", "linf") else n
    if n not in ("linf", "l2", "l1"):
        raise ConfigError(f"unknown norm {norm!r} for {name}: use linf, l2 or l1")
    if hasattr(value, "item") and not isinstance(value, (int, float)) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if not _num(value) or not math.isfinite(float(value)):
        raise ConfigError(f"{name} must be a finite number (a radius in pixel scale, e.g. 8/255), got {value!r}")
    v = float(value)
    if n == "linf" and not 0 < v <= 1:
        raise ConfigError(f"{name} must lie in (0, 1] for the L-inf threat model (pixel scale: 8/255 = 0.031), "
                          f"got {v:g}")
    if not 0 < v <= MAX_L2_RADIUS:
        raise ConfigError(f"{name} must lie in (0, {MAX_L2_RADIUS:g}] for the {n.upper()} threat model (pixel "
                          f"scale), got {v:g}")
    return v


def parse_number(text: str) -> float:
    """The text of a number: ``0.3``, ``3e-2`` or a fraction ``8/255`` (how radii are written); ValueError
    otherwise (also for a zero denominator)."""
    t = str(text).strip()
    if "/" in t:
        try:
            return float(Fraction(t))
        except ZeroDivisionError:
            raise ValueError(f"zero denominator in {text!r}") from None
    return float(t)


def check_keywords(name: str, options: Any, fn: Callable[..., Any], *, exclude: Iterable[str] = ()) -> dict[str, Any]:
    """``options`` must be a mapping whose keys are keyword parameters of ``fn`` (minus ``exclude``)."""
    if not isinstance(options, Mapping):
        raise ConfigError(f"{name} must be a mapping of keyword arguments, got {options!r}")
    params = inspect.signature(fn).parameters
    allowed = sorted(k for k, p in params.items()
                     if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and k not in set(exclude))
    unknown = sorted(str(k) for k in options if k not in allowed)
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in {name}: valid keys are {', '.join(allowed)}")
    return dict(options)


def _range(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f" in [{lo}, {hi}]"
    if lo is not None:
        return f" >= {lo}"
    if hi is not None:
        return f" <= {hi}"
    return ""


def _interval(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    if lo is None and hi is None:
        return ""
    if hi is None:
        return f" {'>' if lo_open else '>='} {lo:g}"
    if lo is None:
        return f" {'<' if hi_open else '<='} {hi:g}"
    return f" in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


# ------------------------------------------------------------------------------------------ argparse types
def arg(check: Callable[..., Any], what: str | None = None, **kw: Any) -> Callable[[str], Any]:
    """An argparse ``type=`` built from a check, so that a flag accepts exactly what the matching YAML key or
    keyword argument accepts: the text is read as an integer (``check`` is :func:`check_int` or
    :func:`check_seed`) or as a number (:func:`parse_number`: ``0.3``, ``3e-2``, ``8/255``), then given to
    ``check("value", value, **kw)``. A float beyond :data:`MAX_MAGNITUDE` in magnitude is refused (products
    with float32 tensors would overflow). Errors read "expected <what>, got <text>"; with ``what`` None they
    carry the check's own line (the radius checks, whose line explains the pixel scale)."""
    is_int = check in (check_int, check_seed)

    def refuse(shown: str, detail: str = "") -> argparse.ArgumentTypeError:
        return argparse.ArgumentTypeError(f"expected {what}{detail}, got {shown}")

    def parse(text: str) -> Any:
        try:
            value: Any = int(text) if is_int else parse_number(text)
        except ValueError:
            kind = what or ("an integer" if is_int else "a number (or a fraction like 8/255)")
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        if what is not None and isinstance(value, float) and not math.isfinite(value):
            raise refuse(repr(text), " (finite)")
        if what is not None and isinstance(value, float) and abs(value) > MAX_MAGNITUDE:
            raise refuse(repr(text), f" no larger than {MAX_MAGNITUDE:g} in magnitude (larger values overflow "
                                     "the float32 computations)")
        try:
            return check("value", value, **kw)
        except ConfigError as exc:
            if what is not None:
                raise refuse(f"{value:g}" if isinstance(value, float) else str(value)) from None
            msg = str(exc)
            raise argparse.ArgumentTypeError(msg[len("value "):] if msg.startswith("value ") else msg) from None

    parse.__name__ = getattr(check, "__name__", "value")
    return parse
