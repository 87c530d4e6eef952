"""The weak-robust set: :func:`select_weak` turns an :class:`Analysis` into a :class:`WeakSet`.

Strategies (:data:`STRATEGIES`): ``weak`` (the paper's rule: the weakest samples by top-K, top fraction or the
"most neighbours misclassified" threshold, optionally class-balanced), ``weak-correct`` (the same among the
samples classified correctly), ``stratified`` (K samples drawn across quantile strata of the local
robustness score, weighted by stratum share: an unbiased estimate of the error on the whole analysed set)
and ``random`` (K samples uniformly at random)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from robustest.core import reprs
from robustest.core.atomic import atomic_save, atomic_write_json
from robustest.core.batching import DataLike, num_samples, take
from robustest.core.errors import ConfigError, DataError
from robustest.selection.strata import ALLOCATIONS, allocate, draw_in_strata, equal_bins, neyman_target
from robustest.weakrobust.analysis import Analysis


@dataclass
class WeakSet:
    """The selected weak-robust samples, weakest first.

    ``indices``: positions in the analysed data set (int64 [M]); ``scores``, ``frac_misclassified``,
    ``labels``: their analysis values; ``rule``: how they were chosen (``rule["strategy"]``: one of
    :data:`STRATEGIES`). ``weights``: float64 [M] summing to 1 for a ``stratified`` set (each sample's
    stratum share N_h / N divided by the n_h samples drawn from the stratum), None otherwise (every sample
    counts the same); :func:`~robustest.weakrobust.validate` computes weighted errors with them.
    """

    indices: torch.Tensor
    scores: torch.Tensor
    frac_misclassified: torch.Tensor
    labels: torch.Tensor
    rule: dict[str, Any] = field(default_factory=dict)
    weights: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __repr__(self) -> str:
        rule = self.rule.get("rule")
        setting = {k: self.rule[k] for k in ("k", "fraction", "threshold") if k in self.rule}
        return reprs.one_line(self, n=len(self), strategy=self.rule.get("strategy", "weak"), rule=rule,
                              **setting, per_class=self.rule.get("per_class"),
                              n_analysed=self.rule.get("n_analysed"),
                              weakest_score=float(self.scores[0]) if len(self) else None)

    def take(self, data: DataLike) -> tuple[torch.Tensor, torch.Tensor]:
        """The weak samples of ``data`` (the data set that was analysed) as ``(x, y)`` tensors."""
        n = num_samples(data)
        if len(self) and int(self.indices.max()) >= n:
            raise DataError(f"weak set index {int(self.indices.max())} is outside the data set of {n} "
                            "samples: use the same data set (and split) that was analysed")
        x, y = take(data, self.indices)
        if y is None:
            raise DataError("the data set needs labels")
        return x, y

    def to_dict(self) -> dict[str, Any]:
        d = {"format": "robustest-weakset", "indices": self.indices, "scores": self.scores,
             "frac_misclassified": self.frac_misclassified, "labels": self.labels, "rule": dict(self.rule)}
        if self.weights is not None:
            d["weights"] = self.weights
        return d

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save as plain tensors (``.pt``) or as JSON (``.json``)."""
        path = Path(path)
        if path.suffix == ".json":
            return atomic_write_json(path, self.to_dict())
        return atomic_save(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> WeakSet:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"weak set file {str(path)!r} does not exist")
        try:
            if path.suffix == ".json":
                d = json.loads(path.read_text())
            else:
                d = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise DataError(f"{path} is not a robustest weak set file (cannot be read)") from exc
        if not isinstance(d, dict) or d.get("format") != "robustest-weakset":
            raise DataError(f"{path} is not a robustest weak set file")
        return cls(indices=torch.as_tensor(d["indices"], dtype=torch.long),
                   scores=torch.as_tensor(d["scores"], dtype=torch.float32),
                   frac_misclassified=torch.as_tensor(d["frac_misclassified"], dtype=torch.float32),
                   labels=torch.as_tensor(d["labels"], dtype=torch.long), rule=dict(d.get("rule") or {}),
                   weights=None if d.get("weights") is None else torch.as_tensor(d["weights"], dtype=torch.float64))


def _balanced_take(order: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """Take ``k`` positions from ``order`` (weakest first) spread as evenly as possible over the classes:
    round-robin over classes by rank within the class; classes with too few samples give their share to
    the others."""
    if k <= 0:
        return order[:0]
    lab = labels[order]
    rank = torch.zeros_like(order)
    for c in torch.unique(lab):
        m = lab == c
        rank[m] = torch.arange(int(m.sum()))
    # sort by (rank within class, global weakness position): classes alternate, weakest first
    key = rank.double() * (len(order) + 1) + torch.arange(len(order)).double()
    chosen = torch.zeros(len(order), dtype=torch.bool)
    chosen[torch.argsort(key)[:k]] = True
    return order[chosen]  # back in global weakness order


STRATEGIES = ("weak", "weak-correct", "stratified", "random")
"""Selection strategies of :func:`select_weak`."""

DEFAULT_SUBSET_SIZE = 1000
"""K of a ``stratified`` or ``random`` set when no size is given (all samples when fewer): the standard error
of an error rate measured on 1000 samples is at most 1.6 points."""


def _stratified(analysis: Analysis, order: torch.Tensor, k: int, strata: int, allocation: str,
                gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Positions (weakest first) and weights of a stratified sample of ``k`` from ``order``."""
    n = len(order)
    h = max(1, min(strata, k, n))
    stratum = equal_bins(n, h)  # rank-quantile strata of the positions in ``order``, equal sizes +-1
    sizes = torch.bincount(stratum, minlength=h)
    if allocation == "neyman":
        # pilot per-sample error probability: 1 if misclassified clean, else the share of wrong neighbours
        pilot = torch.where(analysis.clean_correct[order], analysis.frac_misclassified[order].double(),
                            torch.ones(n, dtype=torch.float64))
        target, floor = neyman_target(stratum, pilot, h), (2 if k >= 2 * h else 1)
    else:
        target, floor = sizes.double(), 1
    alloc = allocate(target, k, sizes, floor)
    picked = draw_in_strata(stratum, alloc, gen)
    weights = [torch.full((len(p),), float(sizes[j]) / n / max(1, int(alloc[j])), dtype=torch.float64)
               for j, p in enumerate(picked)]
    pos, w = torch.cat(picked), torch.cat(weights)
    keep = torch.argsort(pos)  # back into weakness order
    lo_score = [float(analysis.score[order[int(torch.nonzero(stratum == j)[-1])]]) for j in range(h)]
    info = {"strata": h, "allocation": allocation, "stratum_sizes": sizes.tolist(), "stratum_samples": alloc.tolist(),
            "stratum_min_score": lo_score}
    return pos[keep], w[keep], info


def select_weak(
    analysis: Analysis,
    k: int | None = None,
    fraction: float | None = None,
    threshold: float | None = None,
    per_class: bool = False,
    correct_only: bool = False,
    *,
    strategy: str = "weak",
    strata: int = 10,
    allocation: str = "proportional",
    seed: int = 0,
) -> WeakSet:
    """Select a validation set from an :class:`Analysis` (returned weakest first).

    ``strategy``:

    * ``"weak"`` (the paper's rule): the weakest samples. Give at most one of ``k`` (the K weakest),
      ``fraction`` (the weakest ``ceil(fraction N)``), ``threshold`` (samples with more than ``threshold`` of
      their neighbours misclassified; the paper's "most neighbours misclassified" is ``threshold=0.5``, the
      default when none is given). ``per_class``: with ``k``, the K samples are spread evenly over the
      classes (each class gives its weakest); with ``fraction``, each class gives its weakest
      ``ceil(fraction N_c)``; with ``threshold``, the same number of samples the threshold selects is drawn
      class-balanced from the ranking. ``correct_only=True`` is ``"weak-correct"``.
    * ``"weak-correct"``: as ``"weak"``, ranking only the samples the model classifies correctly clean
      (misclassified training samples are wrong under every perturbation, so they carry no robustness signal).
    * ``"stratified"``: the analysed samples, ranked by weakness, are cut into ``strata`` quantile strata of
      equal size; K samples are drawn without replacement across them (``allocation="proportional"``: n_h
      proportional to the stratum size; ``"neyman"``: proportional to N_h S_h, S_h the Bernoulli standard
      deviation of a pilot error probability per stratum, the share of misclassified neighbours (1 for a
      sample misclassified clean), at least 2 per stratum when K >= 2H), each weighted N_h / (N n_h). The
      weighted error is unbiased for the error on all analysed samples, and its variance is at most that of a
      random subset of the same size wherever the strata differ in error (they do: weak strata err more).
    * ``"random"``: K samples uniformly at random (unweighted; unbiased).

    The size of a ``stratified`` or ``random`` set: ``k``, ``ceil(fraction N)``, or the number of samples
    ``threshold`` selects; :data:`DEFAULT_SUBSET_SIZE` (or N) when none is given. ``seed`` drives their draws.
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    if allocation not in ALLOCATIONS:
        raise ConfigError(f"unknown allocation {allocation!r}: use one of {', '.join(ALLOCATIONS)}")
    if isinstance(strata, bool) or not isinstance(strata, int) or strata < 1:
        raise ConfigError(f"strata must be an integer >= 1, got {strata!r}")
    given = [v is not None for v in (k, fraction, threshold)]
    if sum(given) > 1:
        raise ConfigError("give only one of k, fraction, threshold")
    if k is not None and k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    if fraction is not None and not 0 < fraction <= 1:
        raise ConfigError(f"fraction must lie in (0, 1], got {fraction}")
    if threshold is not None and not 0 <= threshold < 1:
        raise ConfigError(f"threshold must lie in [0, 1), got {threshold}")
    if strategy in ("stratified", "random"):
        if correct_only:
            raise ConfigError(f"correct_only applies to the weak strategies, not to {strategy!r}: a {strategy} set "
                              "stands for every analysed sample (use strategy='weak-correct' for the other)")
        if per_class:
            raise ConfigError(f"per_class applies to the weak strategies, not to {strategy!r}")
        return _sampled(analysis, k, fraction, threshold, strategy, strata, allocation, seed)
    if strategy == "weak-correct":
        correct_only = True
    if not any(given):
        threshold = 0.5
    order = analysis.order()
    if correct_only:
        order = order[analysis.clean_correct[order]]
    n = len(order)
    labels = analysis.label
    if k is not None:
        k = min(int(k), n)
        sel = _balanced_take(order, labels, k) if per_class else order[:k]
        rule: dict[str, Any] = {"rule": "top_k", "k": k}
    elif fraction is not None:
        if per_class:
            parts = []
            for c in torch.unique(labels):
                oc = order[labels[order] == c]
                parts.append(oc[: math.ceil(fraction * len(oc))])
            sel = order[torch.isin(order, torch.cat(parts))]
        else:
            sel = order[: math.ceil(fraction * n)]
        rule = {"rule": "top_fraction", "fraction": float(fraction)}
    else:
        assert threshold is not None
        over = analysis.frac_misclassified[order] > threshold
        m = int(over.sum())
        sel = _balanced_take(order, labels, m) if per_class else order[over]
        rule = {"rule": "threshold", "threshold": float(threshold)}
    rule["strategy"] = "weak-correct" if correct_only else "weak"
    rule["per_class"] = bool(per_class)
    rule["correct_only"] = bool(correct_only)
    rule["n_analysed"] = len(analysis)
    rule["analysis"] = dict(analysis.params)
    return WeakSet(indices=analysis.index[sel].clone(), scores=analysis.score[sel].clone(),
                   frac_misclassified=analysis.frac_misclassified[sel].clone(), labels=labels[sel].clone(),
                   rule=rule)


def _sampled(analysis: Analysis, k: int | None, fraction: float | None, threshold: float | None, strategy: str,
             strata: int, allocation: str, seed: int) -> WeakSet:
    """A ``stratified`` or ``random`` set (see :func:`select_weak`)."""
    order = analysis.order()
    n = len(order)
    if k is not None:
        size, rule = min(int(k), n), {"rule": "top_k", "k": min(int(k), n)}
    elif fraction is not None:
        size, rule = math.ceil(fraction * n), {"rule": "top_fraction", "fraction": float(fraction)}
    elif threshold is not None:
        size = int((analysis.frac_misclassified > threshold).sum())
        rule = {"rule": "threshold", "threshold": float(threshold)}
    else:
        size = min(DEFAULT_SUBSET_SIZE, n)
        rule = {"rule": "top_k", "k": size}
    rule.update(strategy=strategy, seed=int(seed))
    gen = torch.Generator().manual_seed(int(seed))
    weights = None
    if size == 0:
        sel = order[:0]
    elif strategy == "random":
        sel = order[torch.sort(torch.randperm(n, generator=gen)[:size]).values]
    else:
        pos, weights, info = _stratified(analysis, order, size, strata, allocation, gen)
        sel = order[pos]
        rule.update(info)
    rule["per_class"] = False
    rule["correct_only"] = False
    rule["n_analysed"] = n
    rule["analysis"] = dict(analysis.params)
    return WeakSet(indices=analysis.index[sel].clone(), scores=analysis.score[sel].clone(),
                   frac_misclassified=analysis.frac_misclassified[sel].clone(), labels=analysis.label[sel].clone(),
                   rule=rule, weights=weights)
