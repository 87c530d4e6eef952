"""``kmst`` (RobOT's KM-ST): ``k`` equal-width sections of the score range, an equal random share of each.

Sections holding fewer inputs than their share give all they have and the shortfall is spread evenly over
the others (water filling), so exactly ``n`` distinct inputs come back even for skewed or constant scores.
Leftover units of an uneven split go to randomly chosen sections (seeded). Order: section by section,
random within.
"""

from __future__ import annotations

import torch

from robustest.selection.checks import check_k, check_scores
from robustest.selection.registry import Request, Strategy

__all__ = ["STRATEGY", "kmst", "sections"]


def sections(scores: torch.Tensor, k: int) -> torch.Tensor:
    """KM-ST section of each score ``[N]`` -> int64 ``[N]`` in ``[0, k)``.

    Sections are ``k`` equal-width bins of ``[min, max]`` (the maximum falls in the last one); constant
    scores all fall in section 0.
    """
    s = check_scores(scores)
    check_k(k)
    if s.numel() == 0:
        return torch.zeros(0, dtype=torch.int64)
    lo, hi = s.min(), s.max()
    if not bool(hi > lo):
        return torch.zeros(s.shape[0], dtype=torch.int64)
    sec = torch.floor((s - lo) / (hi - lo) * int(k)).to(torch.int64)
    return sec.clamp_(0, int(k) - 1)


def _water_fill(counts: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """Split ``n`` (<= counts.sum()) over sections as evenly as their ``counts`` allow."""
    alloc = torch.zeros_like(counts)
    remaining = n
    while remaining > 0:
        room = counts - alloc
        open_ = torch.nonzero(room > 0).flatten()
        share = remaining // len(open_)
        if share > 0:
            add = torch.minimum(room[open_], torch.tensor(share))
            alloc[open_] += add
            remaining -= int(add.sum())
        else:  # fewer units than open sections: one each to randomly chosen sections
            pick = open_[torch.randperm(len(open_), generator=gen)[:remaining]]
            alloc[pick] += 1
            remaining = 0
    return alloc


def kmst(req: Request) -> torch.Tensor:
    """KM-ST on the scores ``[N]`` with ``req.k`` sections -> int64 ``[n]``, section by section."""
    s, n, k, gen = req.inputs, req.n, req.k, req.gen
    sec = sections(s, k)
    counts = torch.bincount(sec, minlength=k)
    alloc = _water_fill(counts, n, gen)
    # random order within each section, vectorised: shuffle, then stable sort by section
    perm = torch.randperm(s.shape[0], generator=gen)
    order = perm[torch.sort(sec[perm], stable=True).indices]
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(s.shape[0]) - starts[sec[order]]
    return order[rank < alloc[sec[order]]]


STRATEGY = Strategy("kmst", "KM-ST: k equal-width sections of the score range, an equal random share from each "
                    "(RobOT)", kmst, options=("k",), seeded=True)
