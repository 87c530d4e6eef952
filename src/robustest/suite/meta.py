"""Every value a suite file stores in ``meta``, checked as a flag is: its type and its range, when the file is read.

A suite file passes its SHA-256 check whatever it holds (the digest is written with the content), so its values are
validated like the user's input: a stored ``n_population`` of -1 or an attack ``seed`` of 10**30 is refused with
one line naming the field and the values it may take, before a check uses it. The one check is
:func:`check_meta`, called by :meth:`robustest.suite.Suite.validate`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from robustest.attacks import NORMS
from robustest.core.errors import ConfigError, DataError
from robustest.core.validation import check_bool, check_choice, check_eps, check_float, check_int, check_seed
from robustest.selection.strata import ALLOCATIONS

__all__ = ["MAX_BATCH_SIZE", "check_meta"]

#: the largest attack batch size a suite may store (a batch of 2^20 images is no batch any device holds)
MAX_BATCH_SIZE = 2**20
#: the largest number of neighbours (analysis) or attack targets a suite may store
MAX_COUNT = 100_000
_SHA256 = re.compile(r"[0-9a-f]{64}")
_VERSIONS = ("standard", "fast")
_NOISES = ("uniform", "gaussian")


def _sha(name: str, value: Any, *, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise ConfigError(f"{name} must be a SHA-256 digest (64 lowercase hex digits), got {value!r}"[:200])
    return value


def _text(name: str, value: Any, *, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not value or len(value) > 1000:
        raise ConfigError(f"{name} must be a text of 1 to 1000 characters{' or null' if allow_none else ''}, got "
                          f"{value!r}"[:200])
    return value


def _mapping(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a mapping, got {type(value).__name__}")
    return value


def _list(name: str, value: Any, length: int | None = None) -> list[Any]:
    if not isinstance(value, list):
        raise ConfigError(f"{name} must be a list, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise ConfigError(f"{name} must hold {length} values (one per stratum), got {len(value)}")
    return value


def _each(name: str, values: list[Any], check: Callable[[str, Any], Any]) -> None:
    for i, v in enumerate(values):
        check(f"{name}[{i}]", v)


def _n_eff(name: str, value: Any) -> None:
    if isinstance(value, float) and math.isinf(value) and value > 0:  # no variance: an exact estimate
        return
    check_float(name, value, lo=0)


def _estimate(name: str, value: Any) -> None:
    e = _mapping(name, value)
    for key in ("value", "ci_low", "ci_high"):
        check_float(f"{name}.{key}", e.get(key), lo=0, hi=1)
    check_float(f"{name}.std_error", e.get("std_error"), lo=0)
    _n_eff(f"{name}.n_eff", e.get("n_eff"))
    check_int(f"{name}.df", e.get("df"), lo=1)
    check_float(f"{name}.level", e.get("level"), lo=0, hi=1, lo_open=True, hi_open=True)


def _fields(meta: dict[str, Any], k: int, h: int) -> None:
    """Raise ConfigError (the field's line) on the first value outside its type and range."""
    check_int("k", meta.get("k"), lo=k, hi=k)
    n = check_int("n_population", meta.get("n_population"), lo=max(k, 1))
    sizes = _list("stratum_sizes", meta.get("stratum_sizes"))
    if not sizes:
        raise ConfigError("stratum_sizes must hold one size per stratum, got none")
    _each("stratum_sizes", sizes, lambda name, v: check_int(name, v, lo=1))
    if sum(sizes) != n:
        raise ConfigError(f"n_population must be the sum of stratum_sizes ({sum(sizes)}), got {n}")
    _text("dataset", meta.get("dataset"), allow_none=True)
    _text("split", meta.get("split"), allow_none=True)
    _sha("data_sha256", meta.get("data_sha256"))
    _sha("samples_sha256", meta.get("samples_sha256"), allow_none=True)
    _sha("baseline_sha256", meta.get("baseline_sha256"))
    _each("stratum_weights", _list("stratum_weights", meta.get("stratum_weights"), h),
          lambda name, v: check_float(name, v, lo=0, hi=1))
    _each("stratum_samples", _list("stratum_samples", meta.get("stratum_samples"), h),
          lambda name, v: check_int(name, v, lo=0, hi=k))
    strata = _mapping("strata", meta.get("strata"))
    check_int("strata.bins", strata.get("bins"), lo=1, hi=h)
    check_bool("strata.by_class", strata.get("by_class"))
    check_int("strata.requested", strata.get("requested"), lo=1, hi=MAX_COUNT)
    check_choice("strata.allocation", strata.get("allocation"), ALLOCATIONS)
    for i, cell in enumerate(_list("strata.cells", strata.get("cells"), h)):
        cell = _mapping(f"strata.cells[{i}]", cell)
        check_int(f"strata.cells[{i}].bin", cell.get("bin"), lo=0, hi=h - 1)
        check_int(f"strata.cells[{i}].class", cell.get("class"), lo=-1, hi=MAX_COUNT)
    analysis = _mapping("analysis", meta.get("analysis"))
    check_int("analysis.n_neighbors", analysis.get("n_neighbors"), lo=1, hi=MAX_COUNT)
    check_float("analysis.eps", analysis.get("eps"), lo=0, hi=2, lo_open=True)
    check_choice("analysis.noise", analysis.get("noise"), _NOISES)
    check_bool("analysis.quantize", analysis.get("quantize"))
    check_seed("analysis.seed", analysis.get("seed"))
    attack = _mapping("attack", meta.get("attack"))
    norm = check_choice("attack.norm", attack.get("norm"), NORMS)
    check_eps("attack.eps", attack.get("eps"), str(norm))
    check_choice("attack.version", attack.get("version"), _VERSIONS)
    check_int("attack.n_targets", attack.get("n_targets"), lo=1, hi=MAX_COUNT, allow_none=True)
    check_seed("attack.seed", attack.get("seed"))
    check_int("attack.batch_size", attack.get("batch_size"), lo=1, hi=MAX_BATCH_SIZE)
    corruption = _mapping("corruption", meta.get("corruption"))
    for i, setting in enumerate(_list("corruption.settings", corruption.get("settings"))):
        if not isinstance(setting, list) or len(setting) != 2:
            raise ConfigError(f"corruption.settings[{i}] must be a [name, severity] pair, got {setting!r}"[:200])
        _text(f"corruption.settings[{i}] name", setting[0])
        check_int(f"corruption.settings[{i}] severity", setting[1], lo=1, hi=5)
    check_seed("corruption.seed", corruption.get("seed"))
    for key, est in _mapping("baseline", meta.get("baseline", {})).items():
        _estimate(f"baseline.{key}", est)
    _list("baseline_flags", meta.get("baseline_flags", []))
    _text("robustest_version", meta.get("robustest_version"), allow_none=True)
    check_int("format_version", meta.get("format_version", 1), lo=1)
    if "certify" in meta:
        from robustest.evaluate.certification import BRACKET_METHODS

        check_choice("certify.method", _mapping("certify", meta["certify"]).get("method"), BRACKET_METHODS)


def check_meta(meta: dict[str, Any], k: int, source: str = "suite") -> None:
    """Check every value of a suite's ``meta`` for its type and range (``k``: the suite's number of samples).
    Raises :class:`DataError` with one line naming
    the field, the values it may take and the value stored."""
    if not isinstance(meta, dict):
        raise DataError(f"{source}: damaged suite: meta must be a mapping: rebuild it with 'robustest suite build'")
    sizes = meta.get("stratum_sizes")
    h = len(sizes) if isinstance(sizes, list) else 0
    try:
        _fields(meta, k, h)
    except ConfigError as exc:
        raise DataError(f"{source}: damaged suite: {exc}: rebuild it with 'robustest suite build'") from None
