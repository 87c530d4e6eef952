"""Stratified sampling, the one home of its pieces: rank-quantile strata, the allocation of a sample among them
(proportional or Neyman) and the draw inside each stratum.

Three users share them: the ``stratified`` selection strategy (:mod:`robustest.selection.stratified`, strata of
score quantiles crossed with the class), the stratified weak-robust validation sets
(:func:`robustest.weakrobust.select_weak`) and the regression suites (:func:`robustest.suite.build_suite`), both
stratified by local robustness.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from robustest.core.errors import ConfigError
from robustest.selection.checks import check_k, check_scores

__all__ = ["ALLOCATIONS", "allocate", "draw_in_strata", "equal_bins", "neyman_target", "quantile_bins",
           "random_remainders"]

ALLOCATIONS = ("proportional", "neyman")
"""How a stratified sample shares its K samples among the strata: in proportion to the stratum sizes N_h, or to
N_h S_h (Neyman: S_h the standard deviation of a pilot error probability in the stratum)."""


def equal_bins(n: int, h: int) -> torch.Tensor:
    """The bin of each of ``n`` ranked positions when cut into ``h`` runs of equal length (+-1), int64 [n] in
    ``[0, h)``: position i falls in bin ``floor(i h / n)``, bin 0 first."""
    return torch.div(torch.arange(n) * int(h), max(n, 1), rounding_mode="floor")


def quantile_bins(scores: Any, k: int) -> torch.Tensor:
    """Equal-frequency bin of each score ``[N]`` -> int64 ``[N]`` in ``[0, min(k, N))``: the scores in rank order
    (ties: lower index first) are cut into ``k`` runs of (nearly) equal length, bin 0 the lowest. Checks
    ``scores`` (finite, 1-D) and ``k`` (>= 1) as :func:`robustest.selection.select` does."""
    s = check_scores(scores)
    check_k(k)
    out = torch.empty(s.shape[0], dtype=torch.int64)
    out[torch.sort(s, stable=True).indices] = equal_bins(s.shape[0], k)
    return out


def neyman_target(stratum: torch.Tensor, pilot: torch.Tensor, h: int) -> torch.Tensor:
    """Neyman's allocation target N_h S_h per stratum (float64 [h]): ``stratum`` (int64 [N]) the stratum of each
    sample, ``pilot`` (float [N] in [0, 1]) its pilot error probability; S_h = sqrt(p_h (1 - p_h)) with p_h the
    stratum's mean pilot. All zero when every stratum is pure (:func:`allocate` then shares by size)."""
    sizes = torch.bincount(stratum, minlength=h).double()
    p = torch.zeros(h, dtype=torch.float64).index_add_(0, stratum, pilot.double()) / sizes
    return sizes * (p * (1 - p)).sqrt()


def allocate(target: torch.Tensor, k: int, caps: torch.Tensor, floor: int) -> torch.Tensor:
    """Integers n_h (int64 [H]) summing to ``k`` with ``min(floor, cap_h) <= n_h <= cap_h``, as close to
    ``k * target_h / sum(target)`` as the largest-remainder rule gets (``target`` float [H] >= 0; all zero: shares
    by stratum size; ``caps`` the stratum sizes N_h, ``k <= sum(caps)``). The one allocation of the stratified
    validation sets and the regression suites. :class:`ConfigError` when ``k`` exceeds the samples or cannot give
    every stratum its floor."""
    caps = caps.long()
    if k > int(caps.sum()):
        raise ConfigError(f"cannot draw {k} samples from {int(caps.sum())}")
    t = target.double().clamp(min=0)
    share = t / t.sum() if float(t.sum()) > 0 else caps.double() / caps.sum()
    lo = torch.clamp(torch.full_like(caps, floor), max=caps)
    if int(lo.sum()) > k:
        raise ConfigError(f"K = {k} is too small for {len(caps)} strata of at least {floor} samples")
    ideal = k * share
    n = torch.minimum(torch.maximum(ideal.floor().long(), lo), caps)
    while int(n.sum()) != k:  # at most H rounds: each moves one sample to/from the stratum furthest from its ideal
        if int(n.sum()) < k:
            gap = torch.where(n < caps, ideal - n, torch.tensor(-math.inf, dtype=torch.float64))
            n[int(torch.argmax(gap))] += 1
        else:
            gap = torch.where(n > lo, n - ideal, torch.tensor(-math.inf, dtype=torch.float64))
            n[int(torch.argmax(gap))] -= 1
    return n


def random_remainders(counts: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """Proportional shares of ``n`` among strata of ``counts`` samples (int64 [H]): ``n * size / N`` rounded down,
    the leftover units to the strata with the largest fractional parts, ties broken at random by ``gen``."""
    quota = counts.to(torch.float64) * n / int(counts.sum())
    alloc = torch.floor(quota).to(torch.int64)
    rest = n - int(alloc.sum())
    if rest > 0:  # largest remainders, ties at random: sort by (fraction desc, random key)
        frac = quota - alloc
        shuffled = torch.randperm(len(counts), generator=gen)
        order = shuffled[torch.sort(frac[shuffled], descending=True, stable=True).indices]
        alloc[order[:rest]] += 1
    return alloc


def draw_in_strata(stratum: torch.Tensor, alloc: torch.Tensor, gen: torch.Generator) -> list[torch.Tensor]:
    """For each stratum j in turn, ``alloc[j]`` of its members (positions where ``stratum == j``) drawn uniformly
    without replacement by ``gen``: one int64 tensor per stratum, in the draw's order."""
    picked = []
    for j in range(len(alloc)):  # a loop over the strata (a handful), not the samples
        members = torch.nonzero(stratum == j).flatten()
        picked.append(members[torch.randperm(len(members), generator=gen)[: int(alloc[j])]])
    return picked
