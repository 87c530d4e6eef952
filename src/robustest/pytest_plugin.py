"""pytest plugin of robustest: robustness regression tests next to unit tests.

Registered as the ``pytest11`` entry point ``robustest`` (pyproject.toml), so pytest loads it once robustest is
installed; without the entry point (e.g. running from a source tree) enable it with ``-p robustest.pytest_plugin``
or ``pytest_plugins = ["robustest.pytest_plugin"]`` in the root conftest.py. It imports nothing heavy until a test
uses it, so it costs nothing in test runs that do not.

* marker ``@pytest.mark.robustness(eps=..., min_accuracy=..., attack=..., norm=...)``: tags a robustness test
  (select with ``-m robustness``, skip with ``-m "not robustness"``) and gives the defaults of the fixture.
* fixture ``assert_robust``: :func:`robustest.testing.assert_robust` with the marker's arguments and the command
  line's ``--robustness-limit`` / ``--robustness-seed`` filled in (arguments of the call win).
* fixture ``assert_no_regression``: :func:`robustest.testing.assert_no_regression` (candidate, suite[, baseline]),
  listed in the same summary.
* ``--robustness-limit N``: evaluate at most N samples per check (quick CI runs); ``--robustness-seed S``.
* the terminal summary lists every check: test, attack, eps, measured and required accuracy, verdict.
"""

from __future__ import annotations

from typing import Any

import pytest

_RESULTS_KEY = "robustest_checks"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("robustest", "robustness tests (robustest)")
    group.addoption("--robustness-limit", type=int, default=None, metavar="N",
                    help="evaluate at most N samples in each assert_robust check")
    group.addoption("--robustness-seed", type=int, default=None, metavar="S",
                    help="seed of every assert_robust check (default: the call's, 0)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "robustness(eps=None, min_accuracy=None, attack='auto', norm='linf', accept_flags=()): a robustness test; "
        "its arguments are the defaults of the assert_robust fixture",
    )
    setattr(config, _RESULTS_KEY, [])


@pytest.fixture
def assert_robust(request: pytest.FixtureRequest) -> Any:
    """``assert_robust(model, data, **kw)``: robustest.testing.assert_robust with defaults from the test's
    ``robustness`` marker and the ``--robustness-limit`` / ``--robustness-seed`` options; every check is
    listed in the terminal summary."""
    marker = request.node.get_closest_marker("robustness")
    defaults: dict[str, Any] = dict(marker.kwargs) if marker else {}
    limit = request.config.getoption("--robustness-limit")
    seed = request.config.getoption("--robustness-seed")
    if limit is not None:
        defaults["limit"] = limit
    if seed is not None:
        defaults["seed"] = seed
    checks = getattr(request.config, _RESULTS_KEY, [])

    def check(model: Any, data: Any, **kw: Any) -> Any:
        from robustest.testing import assert_robust as _assert_robust

        args = {**defaults, **kw}
        for key in ("eps", "min_accuracy"):
            if key not in args:
                raise TypeError(f"assert_robust needs {key}=: pass it or set it on @pytest.mark.robustness")
        row = {"test": request.node.nodeid, "attack": str(args.get("attack", "auto")), "eps": args["eps"],
               "required": args["min_accuracy"], "measured": None, "passed": False}
        checks.append(row)
        try:
            res = _assert_robust(model, data, **args)
        except AssertionError as exc:
            row["measured"] = _measured(str(exc))
            raise
        row.update(measured=res.robust_accuracy, passed=True, n=res.num_samples)
        return res

    return check


@pytest.fixture
def assert_no_regression(request: pytest.FixtureRequest) -> Any:
    """``assert_no_regression(candidate, suite, baseline=None, **kw)``: robustest.testing.assert_no_regression;
    every check is listed in the terminal summary."""
    checks = getattr(request.config, _RESULTS_KEY, [])

    def check(candidate: Any, suite: Any, baseline: Any = None, **kw: Any) -> Any:
        from robustest.testing import assert_no_regression as _assert_no_regression

        row = {"test": request.node.nodeid, "kind": "suite", "message": "", "passed": False}
        checks.append(row)
        try:
            res = _assert_no_regression(candidate, suite, baseline, **kw)
        except AssertionError as exc:
            row["message"] = str(exc)
            raise
        row.update(message=res.message(), passed=True)
        return res

    return check


def _measured(message: str) -> float | None:
    try:
        return float(message.split("robust accuracy ", 1)[1].split("%", 1)[0]) / 100
    except (IndexError, ValueError):
        return None


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    checks = getattr(config, _RESULTS_KEY, [])
    if not checks:
        return
    terminalreporter.section("robustness checks (robustest)")
    for r in checks:
        if r.get("kind") == "suite":
            verdict = "ok" if r["passed"] else "FAILED"
            terminalreporter.write_line(f"{verdict:6s} {r['test']}: {r['message'] or 'not run'}")
            continue
        got = "-" if r["measured"] is None else f"{100 * r['measured']:.2f}%"
        verdict = "ok" if r["passed"] else "FAILED"
        terminalreporter.write_line(f"{verdict:6s} {r['test']}: robust {got} (required {100 * r['required']:.2f}%, "
                                    f"{r['attack']}, eps={r['eps']:g})")
