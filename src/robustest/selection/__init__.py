"""Test selection: pick ``n`` inputs from a scored pool.

``select(scores, n, strategy, *, k=4, seed=0)`` returns int64 indices into the pool (CPU tensor, all
distinct, exactly ``min(n, N)`` of them). Every strategy is a :class:`Strategy` in a registry, one file per
family; a new one is one function plus one :func:`register` call (from anywhere; :func:`registered` adds one
for a ``with`` block only). The built-in strategies:

* ``best`` (RobOT BE-ST, ``best.py``): the ``n // 2`` lowest and the ``n - n // 2`` highest scores. Order:
  lowest first (ascending), then highest (descending).
* ``kmst`` (RobOT KM-ST, ``kmst.py``): the score range ``[min, max]`` is split into ``k`` equal-width
  sections; each non-empty section gets an equal share of ``n`` drawn uniformly at random from it. Sections
  holding fewer inputs than their share give all they have and the shortfall is spread evenly over the others
  (water filling), so exactly ``n`` distinct inputs come back even for skewed or constant scores. Leftover
  units of an uneven split go to randomly chosen sections (seeded). Order: section by section, random within.
* ``top`` / ``bottom`` (``gini.py``): the ``n`` highest / lowest scores in rank order (ties: lower index
  first). Use ``top`` for DeepGini, entropy, LSA/DSA, FOL; ``bottom`` for margin or max probability.
* ``random`` (``uniform.py``): ``n`` inputs uniformly at random (seeded).
* ``coverage`` (``coverage.py``): greedy additional coverage. ``scores`` is a ``BoolTensor[N, F]`` saying
  which coverage cells (e.g. KMNC sections, NC neurons; :meth:`robustest.metrics.coverage.CoverageProfile.bits`)
  each input covers. Each step picks the input that covers the most cells not yet covered (ties: lower
  index). Once no input adds coverage, the rest is filled by ``fill``: ``"total"`` (default; most cells
  covered, ties lower index) or ``"random"`` (seeded).
* ``stratified`` (``stratified.py``): stratified random sampling. The pool is cut into ``k`` equal-frequency
  score bins (score quantiles; ties split by index) and, when ``labels`` are given, crossed with the class:
  ``k x C`` strata. Each stratum gets its proportional share ``n * size / N`` (rounded down; the leftover
  units go to the strata with the largest fractional parts, ties broken at random), drawn uniformly at random
  inside it. It is random selection with the variance over the score range and the classes taken out: a
  random draw of a small budget can miss a class or over-sample one end of the FOL range, this one cannot.
  Order: stratum by stratum, random within.
* ``fol-prop`` (``proportional.py``): weighted sampling without replacement with probability proportional to
  the score (e.g. FOL; scores must be >= 0), by the exponential-key method of Efraimidis and Spirakis (2006):
  each input draws ``u ~ U(0, 1)`` and the ``n`` largest keys ``log(u) / score`` win, in one sort. Inputs of
  score 0 come last, in random order, and only when fewer than ``n`` inputs have a positive score. Order:
  draw order.
* ``kcenter`` (``kcenter.py``): k-center greedy (the core-set selection of Sener and Savarese, 2018).
  ``scores`` is a float ``[N, D]`` tensor of features (e.g. penultimate-layer activations). The first centre
  is drawn uniformly at random (seeded); each further step picks the input farthest (Euclidean) from its
  nearest chosen centre (ties: lower index), so the selection covers the feature space with the smallest
  radius the greedy rule finds (within twice the optimal radius). One ``[N, D]`` distance update per pick on
  the features' device; duplicates are picked only once every distinct point is taken. Order: pick order.

The scores selection reads, and ``robustest score`` writes, are a scores file (:mod:`.scores_file`: scores.pt or
scores.csv, :func:`~.scores_file.read_scores`); :mod:`.score_reports` draws the reports of both verbs.

What a strategy declares it needs (:attr:`Strategy.needs`: ``scores``, ``bits`` or ``features``; whether it
takes ``labels``) decides how :func:`select` checks its input (``checks.py``), and tells a pipeline such as
:mod:`robustest.robot` what to compute for it.

Errors are :class:`robustest.core.errors.ConfigError` with a one-line message; ``n`` larger than the pool
returns the whole pool with a :class:`UserWarning`.
"""

from __future__ import annotations

from robustest.selection import best, coverage, gini, kcenter, kmst, proportional, stratified, uniform
from robustest.selection.dispatch import select
from robustest.selection.kmst import sections
from robustest.selection.registry import (
    Request,
    Strategy,
    describe,
    get,
    names,
    register,
    registered,
    unregister,
)
from robustest.selection.strata import quantile_bins

__all__ = ["Request", "Strategy", "describe", "get", "names", "quantile_bins", "register", "registered",
           "sections", "select", "unregister"]

# the built-in strategies, in the order names() lists them
for _strategy in (best.STRATEGY, kmst.STRATEGY, gini.TOP, gini.BOTTOM, uniform.STRATEGY, coverage.STRATEGY,
                  stratified.STRATEGY, proportional.STRATEGY, kcenter.STRATEGY):
    register(_strategy)
del _strategy
