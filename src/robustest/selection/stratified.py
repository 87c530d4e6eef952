"""``stratified``: stratified random sampling over score-quantile bins (crossed with the class when labels
are given).

The pool is cut into ``k`` equal-frequency score bins (score quantiles; ties split by index) and, with
``labels``, crossed with the class: ``k x C`` strata. Each stratum gets its proportional share
``n * size / N`` (rounded down; the leftover units go to the strata with the largest fractional parts, ties
broken at random), drawn uniformly at random inside it. It is random selection with the variance over the
score range and the classes taken out. Order: stratum by stratum, random within.
"""

from __future__ import annotations

from typing import Any

import torch

from robustest.selection.checks import check_k, check_scores
from robustest.selection.registry import Request, Strategy

__all__ = ["STRATEGY", "quantile_bins", "stratified"]


def quantile_bins(scores: Any, k: int) -> torch.Tensor:
    """Equal-frequency bin of each score ``[N]`` -> int64 ``[N]`` in ``[0, min(k, N))``: the scores in rank order
    (ties: lower index first) are cut into ``k`` runs of (nearly) equal length, bin 0 the lowest."""
    s = check_scores(scores)
    check_k(k)
    num = s.shape[0]
    out = torch.empty(num, dtype=torch.int64)
    out[torch.sort(s, stable=True).indices] = torch.arange(num) * int(k) // max(num, 1)
    return out


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
    quota = counts.to(torch.float64) * n / num
    alloc = torch.floor(quota).to(torch.int64)
    rest = n - int(alloc.sum())
    if rest > 0:  # largest remainders, ties at random: sort by (fraction desc, random key)
        frac = quota - alloc
        shuffled = torch.randperm(len(counts), generator=gen)
        order = shuffled[torch.sort(frac[shuffled], descending=True, stable=True).indices]
        alloc[order[:rest]] += 1
    perm = torch.randperm(num, generator=gen)
    order = perm[torch.sort(strata[perm], stable=True).indices]
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(num) - starts[strata[order]]
    return order[rank < alloc[strata[order]]]


STRATEGY = Strategy("stratified", "stratified random: k score-quantile bins (x class with labels), proportional "
                    "shares", stratified, labels=True, options=("k",), seeded=True)
