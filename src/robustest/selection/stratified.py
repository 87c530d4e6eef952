"""``stratified``: stratified random sampling over score-quantile bins (crossed with the class when labels
are given).

The pool is cut into ``k`` equal-frequency score bins (score quantiles; ties split by index) and, with
``labels``, crossed with the class: ``k x C`` strata. Each stratum gets its proportional share
``n * size / N`` (rounded down; the leftover units go to the strata with the largest fractional parts, ties
broken at random), drawn uniformly at random inside it. It is random selection with the variance over the
score range and the classes taken out. Order: stratum by stratum, random within.
"""

from __future__ import annotations

import torch

from robustest.selection.registry import Request, Strategy
from robustest.selection.strata import quantile_bins, random_remainders

__all__ = ["STRATEGY", "stratified"]


def stratified(req: Request) -> torch.Tensor:
    """Stratified random selection on the scores ``[N]`` (``req.k`` bins, x class with ``req.labels``) ->
    int64 ``[n]``, stratum by stratum."""
    s, n, k, labels, gen = req.inputs, req.n, req.k, req.labels, req.gen
    num = s.shape[0]
    strata = quantile_bins(s, k)
    if labels is not None:
        cls = torch.unique(labels, return_inverse=True)[1]
        strata = cls * int(k) + strata
    strata = torch.unique(strata, return_inverse=True)[1]  # dense ids 0..S-1
    counts = torch.bincount(strata)
    alloc = random_remainders(counts, n, gen)
    perm = torch.randperm(num, generator=gen)
    order = perm[torch.sort(strata[perm], stable=True).indices]
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(num) - starts[strata[order]]
    return order[rank < alloc[strata[order]]]


STRATEGY = Strategy("stratified", "stratified random: k score-quantile bins (x class with labels), proportional "
                    "shares", stratified, labels=True, options=("k",), seeded=True)
