"""Summary statistics of a 1-D tensor: the one home of the mean / median / quantile tables the results record
(perturbation sizes, certificate margins, FOL of generated tests, scores, RobOT's pool).

``describe(values, ("mean", "median", "max"))`` -> ``{"mean": ..., "median": ..., "max": ...}``; a mapping
``{"n": "count", "median": "q50"}`` names the keys differently from the statistics they hold.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch

__all__ = ["STATISTICS", "describe"]

#: the statistics :func:`describe` knows, besides ``qNN`` (the NN % quantile, linear interpolation: q50 is the
#: midpoint of the two middle values of an even count, where ``median`` is torch's, the lower of the two)
STATISTICS = ("count", "mean", "std", "min", "max", "median")
_QUANTILE = re.compile(r"^q(\d\d)$")


def describe(values: torch.Tensor, stats: Sequence[str] | Mapping[str, str], *,
             finite: bool = False) -> dict[str, float | int]:
    """The statistics ``stats`` of the values [N] (computed in float64), keyed by name: a sequence of statistic
    names, or a mapping key -> statistic. ``std`` is the sample standard deviation (0 for a single value);
    ``finite``: NaN and infinite values are left out first. ``values`` must hold at least one value (after the
    finite filter) unless only ``count`` is asked for.

    Example: ``describe(torch.tensor([1., 2., 4.]), {"n": "count", "median": "q50"})`` -> ``{"n": 3, "median": 2.0}``.
    Raises ValueError for an unknown statistic or for statistics of no value."""
    v = values.detach().double().cpu().flatten()
    if finite:
        v = v[torch.isfinite(v)]
    named = dict(stats) if isinstance(stats, Mapping) else {s: s for s in stats}
    unknown = [s for s in named.values() if s not in STATISTICS and not _QUANTILE.match(s)]
    if unknown:
        raise ValueError(f"unknown statistic(s) {unknown}: choose from {', '.join(STATISTICS)} or qNN")
    if v.numel() == 0 and any(s != "count" for s in named.values()):
        raise ValueError("statistics of no value: check for an empty tensor first")
    qs = sorted({int(m.group(1)) for s in named.values() if (m := _QUANTILE.match(s))})
    qv = dict(zip(qs, torch.quantile(v, torch.tensor(qs, dtype=torch.float64) / 100).tolist())) if qs else {}
    out: dict[str, float | int] = {}
    for key, s in named.items():
        if s == "count":
            out[key] = int(v.numel())
        elif s == "mean":
            out[key] = float(v.mean())
        elif s == "std":
            out[key] = float(v.std()) if v.numel() > 1 else 0.0
        elif s == "min":
            out[key] = float(v.min())
        elif s == "max":
            out[key] = float(v.max())
        elif s == "median":
            out[key] = float(v.median())
        else:
            out[key] = qv[int(s[1:])]
    return out
