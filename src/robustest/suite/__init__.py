"""Robustness regression suites: a small sample of a data split, stratified by local robustness, that gates a
candidate model against its baseline (``robustest suite build`` / ``robustest suite check``; docs/SUITE.md).

* :func:`build_suite` draws K samples stratified by the weak-robust local robustness score (and class), runs the
  baseline's evaluation on them and returns a :class:`Suite` (:meth:`Suite.save` / :meth:`Suite.load`: a
  versioned file read with ``torch.load(weights_only=True)``).
* :func:`check_suite` evaluates a candidate on the suite: the stratified robust accuracy with its interval and,
  against the baseline on the same samples, the paired drop with its interval, the exact McNemar test and a
  verdict.
* :mod:`robustest.suite.stats`: the stratified estimate, the paired difference and the exact test.
"""

from robustest.suite.build import build_suite
from robustest.suite.check import DEFAULT_ALPHA, DEFAULT_MAX_DROP, SuiteCheck, check_suite, load_suite
from robustest.suite.format import SUITE_FORMAT, SUITE_VERSION, Suite, model_fingerprint

__all__ = ["DEFAULT_ALPHA", "DEFAULT_MAX_DROP", "SUITE_FORMAT", "SUITE_VERSION", "Suite", "SuiteCheck", "build_suite",
           "check_suite", "load_suite", "model_fingerprint"]
