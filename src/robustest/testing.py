"""Robustness tests next to unit tests: :func:`assert_robust` and the pytest plugin that goes with it.

    from robustest.testing import assert_robust

    def test_model_is_robust():
        assert_robust(model, test_data, eps=0.1, min_accuracy=0.80, attack="fast", limit=500)

``assert_robust`` runs :func:`robustest.evaluate.evaluate` and raises ``AssertionError`` (with the measured
accuracy, the requirement and the attack in one line) when the robust accuracy is below ``min_accuracy`` or when
the evaluation raised a flag of severity ``unreliable`` that ``accept_flags`` does not name; it returns the
:class:`robustest.evaluate.EvalResult` otherwise. The pytest plugin (:mod:`robustest.pytest_plugin`,
registered as a ``pytest11`` entry point, so installed robustest makes it available to pytest) adds the
``robustness`` marker, an ``assert_robust`` fixture that takes eps / min_accuracy from the marker, the options
``--robustness-limit`` and ``--robustness-seed``, and a summary of every check at the end of the run.

:func:`assert_no_regression` checks a candidate model against a regression suite (``robustest suite build``,
docs/SUITE.md) and fails when its robust accuracy dropped significantly and by more than ``max_drop``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from robustest.core.batching import DataLike
from robustest.core.errors import ConfigError

__all__ = ["assert_no_regression", "assert_robust", "robust_accuracy"]


def _limited(data: DataLike, limit: int | None) -> DataLike:
    if limit is None:
        return data
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"limit must be a positive integer, got {limit!r}")
    from robustest.core.batching import as_tensors

    x, y = as_tensors(data)
    return x[:limit], (None if y is None else y[:limit])


_VERSIONS = ("auto", "standard", "fast", "rand")


def _plan_of(attack: Any) -> tuple[str, Any]:
    """attack -> (evaluate version, custom attacks): "auto" / "standard" / "fast" / "rand", one attack name or a
    list of them (names or (name, params) pairs) for a custom ensemble."""
    if isinstance(attack, str) and attack.lower() in _VERSIONS:
        return attack.lower(), None
    if isinstance(attack, str):
        return "custom", [attack]
    if isinstance(attack, (list, tuple)) and attack:
        if len(attack) == 2 and isinstance(attack[0], str) and isinstance(attack[1], dict):
            return "custom", [tuple(attack)]
        return "custom", list(attack)
    raise ConfigError(f"attack must be 'auto', 'standard', 'fast', 'rand', an attack name or a list of them, got "
                      f"{attack!r}")


def robust_accuracy(model: nn.Module, data: DataLike, *, eps: float, attack: Any = "auto", norm: str = "linf",
                    seed: int = 0, limit: int | None = None, batch_size: int = 256, **kw: Any) -> Any:
    """Run :func:`robustest.evaluate.evaluate` with ``attack`` ("auto", "standard", "fast", "rand", an attack name
    such as "apgd-ce" or "pgd", or a list of them) on the first ``limit`` samples of labelled ``data``; returns the
    :class:`EvalResult`. ``kw`` go to ``evaluate`` (e.g. ``n_targets``, ``bpda``, ``surrogate``)."""
    from robustest.evaluate import evaluate

    version, attacks = _plan_of(attack)
    return evaluate(model, _limited(data, limit), eps, norm=norm, version=version, attacks=attacks, seed=seed,
                    batch_size=batch_size, **kw)


def assert_robust(model: nn.Module, data: DataLike, *, eps: float, min_accuracy: float, attack: Any = "auto",
                  norm: str = "linf", seed: int = 0, limit: int | None = None, batch_size: int = 256,
                  accept_flags: Any = (), **kw: Any) -> Any:
    """Assert that ``model`` keeps a robust accuracy of at least ``min_accuracy`` (a fraction in [0, 1]) on
    labelled ``data`` (images N x C x H x W in [0, 1], int64 labels) against ``attack`` at radius ``eps``.

    ``attack``: "auto" (the default: the fast ensemble, checked, escalating where a probe finds masked
    gradients), "standard" (AutoAttack's ensemble), "fast" (APGD-CE + APGD-T on 3 targets), "rand" (for
    randomised models), an attack name ("apgd-ce", "square", "pgd", ...) or a list of names for a custom ensemble.
    ``limit`` uses only the first N samples (robustness tests stay quick). Seeded: the same call gives the same
    verdict on a deterministic model. ``accept_flags``: names of ``unreliable`` flags the check accepts.
    Raises ``AssertionError`` naming the measured and required accuracy, or the flags that make the evaluation
    unreliable; returns the ``EvalResult`` otherwise.
    """
    from robustest.evaluate.flags import check_accepted

    if isinstance(min_accuracy, bool) or not isinstance(min_accuracy, (int, float)) or not 0 <= min_accuracy <= 1:
        raise ConfigError(f"min_accuracy must be a fraction in [0, 1], got {min_accuracy!r}")
    accepted = check_accepted(accept_flags)
    res = robust_accuracy(model, data, eps=eps, attack=attack, norm=norm, seed=seed, limit=limit,
                          batch_size=batch_size, **kw)
    if res.robust_accuracy < min_accuracy:
        raise AssertionError(
            f"robust accuracy {100 * res.robust_accuracy:.2f}% < required {100 * min_accuracy:.2f}% "
            f"({norm} eps={eps:g}, {res.version} [{', '.join(res.attacks)}], {res.num_samples} samples, clean "
            f"{100 * res.clean_accuracy:.2f}%)")
    stopping = res.blocking(accepted)
    if stopping:
        raise AssertionError(
            f"robust accuracy {100 * res.robust_accuracy:.2f}% cannot be trusted: the evaluation is flagged "
            f"unreliable ({'; '.join(f'{f.name}: {f.message}' for f in stopping)}); fix the cause or accept with "
            f"accept_flags=[{', '.join(repr(f.name) for f in stopping)}]")
    return res


def assert_no_regression(candidate: nn.Module, suite: Any, baseline: nn.Module | None = None, *,
                         alpha: float = 0.05, max_drop: float = 0.02, version: str | None = None,
                         accept_flags: Any = ()) -> Any:
    """Assert that ``candidate`` is not less robust than the baseline on a regression suite.

    ``suite``: a :class:`robustest.suite.Suite` or the path of a ``suite.pt`` (``robustest suite build``).
    ``baseline``: None compares with the outcomes stored in the suite (its baseline model's); a model is
    evaluated on the suite's K samples (or its stored outcomes reused when it has the suite's weights). The
    check fails when the exact one-sided McNemar test of the paired outcomes is significant at ``alpha`` AND the
    stratified drop of robust accuracy exceeds ``max_drop`` (a fraction: 0.02 = 2 points). ``version``:
    "standard" or "fast" (default: the suite's). It also fails when an evaluation raised a flag of severity
    ``unreliable`` not named in ``accept_flags``. Raises ``AssertionError`` with the estimate, the drop with its
    interval, the p-value and the blocking flags in one paragraph; returns the :class:`robustest.suite.SuiteCheck`
    otherwise.
    """
    from robustest.suite import check_suite

    res = check_suite(candidate, suite, baseline, alpha=alpha, max_drop=max_drop, version=version,
                      accept_flags=accept_flags)
    if res.failed:
        raise AssertionError(res.message())
    return res
