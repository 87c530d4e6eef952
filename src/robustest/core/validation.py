"""One validation layer for every value a user gives: CLI flags, YAML keys and Python keyword arguments.

Each check takes the value and the name the user knows it by (``--eps``, ``eps``), returns the value in
its canonical type, and raises :class:`ConfigError` with one line naming the value, what is allowed and
the value given. Numbers must be finite (NaN and infinities are refused everywhere), integers must be
integers (a YAML ``3.0`` or ``true`` is not an integer), booleans must be booleans (a YAML ``"no"`` is a
string, not false), paths must be strings. The CLI's argparse types come from the same checks
(:func:`arg`), so a flag and the matching YAML key or keyword argument accept exactly the same values.

:class:`Rule` describes one setting; a table of rules validates a whole mapping (:func:`check_mapping`,
unknown keys refused with the list of valid ones) and exports it as a JSON Schema (:func:`json_schema`).
"""

from __future__ import annotations

import argparse
import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from robustest.core.errors import ConfigError

__all__ = [
    "Rule",
    "arg",
    "check_bool",
    "check_choice",
    "check_eps",
    "check_float",
    "check_int",
    "check_keywords",
    "check_mapping",
    "check_seed",
    "check_str",
    "json_schema",
    "parse_number",
]

MAX_EPOCHS = 100_000
MAX_L2_RADIUS = 1000.0  # an L2 (or L1) radius beyond this is no bound at all on [0, 1] images of any common size
MAX_SEED = 2**63  # seeds lie in [0, 2^63): what torch.Generator.manual_seed takes


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


# ------------------------------------------------------------------------------------------- rule tables
@dataclass(frozen=True)
class Rule:
    """What one setting accepts: ``kind`` int, float, bool, str, choice, eps, list, mapping or any."""

    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    allow_none: bool = False
    choices: tuple[str, ...] = ()
    items: Rule | None = None
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str, value: Any) -> Any:
        if value is None and self.allow_none:
            return None
        k = self.kind
        if k == "int":
            return check_int(name, value, None if self.lo is None else int(self.lo),
                             None if self.hi is None else int(self.hi))
        if k == "float":
            return check_float(name, value, self.lo, self.hi, lo_open=self.lo_open, hi_open=self.hi_open)
        if k == "eps":
            return check_eps(name, value)
        if k == "bool":
            return check_bool(name, value)
        if k == "str":
            return check_str(name, value)
        if k == "choice":
            return check_choice(name, value, self.choices)
        if k == "list":
            if not isinstance(value, (list, tuple)) or not value:
                raise ConfigError(f"{name} must be a non-empty list, got {value!r}")
            return [self.items.check(f"{name}[{i}]", v) if self.items else v for i, v in enumerate(value)]
        if k == "mapping":
            if not isinstance(value, Mapping):
                raise ConfigError(f"{name} must be a mapping of settings, got {value!r}")
            return dict(value)
        return value

    def schema(self) -> dict[str, Any]:
        s: dict[str, Any]
        k = self.kind
        if k == "int":
            s = {"type": "integer"}
        elif k in ("float", "eps"):
            s = {"type": "number"}
        elif k == "bool":
            s = {"type": "boolean"}
        elif k == "str":
            s = {"type": "string", "minLength": 1}
        elif k == "choice":
            s = {"enum": list(self.choices)}
        elif k == "list":
            s = {"type": "array", "minItems": 1}
            if self.items is not None:
                s["items"] = self.items.schema()
        elif k == "mapping":
            s = {"type": "object"}
        else:
            s = {}
        lo, hi = (0.0, 1.0) if k == "eps" else (self.lo, self.hi)
        lo_open = True if k == "eps" else self.lo_open
        if lo is not None:
            s["exclusiveMinimum" if lo_open else "minimum"] = lo
        if hi is not None:
            s["exclusiveMaximum" if self.hi_open else "maximum"] = hi
        s.update(self.extra)
        if self.description:
            s["description"] = self.description
        if self.allow_none:
            s = {"anyOf": [s, {"type": "null"}]} if s else {}
        return s


def check_mapping(what: str, values: Mapping[str, Any], rules: Mapping[str, Rule]) -> dict[str, Any]:
    """Validate every key of ``values`` against ``rules`` (unknown keys refused with the valid ones listed);
    returns the checked values."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{what} must be a mapping of settings, got {type(values).__name__}")
    unknown = sorted(str(k) for k in values if k not in rules)
    if unknown:
        raise ConfigError(f"unknown {what} key {unknown[0]!r}: valid keys are {', '.join(sorted(rules))}")
    return {k: rules[k].check(k, v) for k, v in values.items()}


def json_schema(title: str, rules: Mapping[str, Rule], defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of a settings mapping described by ``rules``."""
    props = {}
    for k, r in rules.items():
        s = r.schema()
        if defaults is not None and k in defaults and _json_plain(defaults[k]):
            s = {**s, "default": defaults[k]}
        props[k] = s
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, "type": "object",
            "properties": props, "additionalProperties": False}


def _json_plain(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str)) or (
        isinstance(v, (list, tuple)) and all(_json_plain(t) for t in v)) or (
        isinstance(v, dict) and all(isinstance(k, str) and _json_plain(t) for k, t in v.items()))


# ------------------------------------------------------------------------------------------ argparse types
def arg(check: Callable[..., Any], **kw: Any) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses the text as a number (int when ``check`` is :func:`check_int`, else
    float) and applies ``check(name, value, **kw)``; the error names what is allowed."""
    is_int = check is check_int

    def parse(text: str) -> Any:
        try:
            value: Any = int(text) if is_int else parse_number(text)
        except ValueError:
            try:
                probe = float(text)
            except ValueError:
                probe = None
            kind = "an integer" if is_int else "a number"
            if is_int and probe is not None:
                raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        try:
            return check("value", value, **kw)
        except ConfigError as exc:
            msg = str(exc)
            raise argparse.ArgumentTypeError(msg[len("value "):] if msg.startswith("value ") else msg) from None

    parse.__name__ = getattr(check, "__name__", "value")
    return parse
