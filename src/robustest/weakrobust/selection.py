"""The weak-robust set: :func:`select_weak` turns an :class:`Analysis` into a :class:`WeakSet` (top-K,
top fraction, the "most neighbours misclassified" threshold, optionally class-balanced)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from robustest import _repr
from robustest.errors import ConfigError, DataError
from robustest.runtime import (
    DataLike,
    atomic_save,
    atomic_write_json,
    num_samples,
    take,
)
from robustest.weakrobust.analysis import Analysis


@dataclass
class WeakSet:
    """The selected weak-robust samples, weakest first.

    ``indices``: positions in the analysed data set (int64 [M]); ``scores``, ``frac_misclassified``,
    ``labels``: their analysis values; ``rule``: how they were chosen.
    """

    indices: torch.Tensor
    scores: torch.Tensor
    frac_misclassified: torch.Tensor
    labels: torch.Tensor
    rule: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __repr__(self) -> str:
        rule = self.rule.get("rule")
        setting = {k: self.rule[k] for k in ("k", "fraction", "threshold") if k in self.rule}
        return _repr.one_line(self, n=len(self), rule=rule, **setting, per_class=self.rule.get("per_class"),
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
        return {"format": "robustest-weakset", "indices": self.indices, "scores": self.scores,
                "frac_misclassified": self.frac_misclassified, "labels": self.labels, "rule": dict(self.rule)}

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
                   labels=torch.as_tensor(d["labels"], dtype=torch.long), rule=dict(d.get("rule") or {}))


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


def select_weak(
    analysis: Analysis,
    k: int | None = None,
    fraction: float | None = None,
    threshold: float | None = None,
    per_class: bool = False,
    correct_only: bool = False,
) -> WeakSet:
    """Select the weak-robust samples of an :class:`Analysis` (weakest first).

    Give at most one of: ``k`` (the K weakest), ``fraction`` (the weakest ``ceil(fraction N)``),
    ``threshold`` (samples with more than ``threshold`` of their neighbours misclassified; the paper's
    "most neighbours misclassified" is ``threshold=0.5``, the default when none is given).
    ``per_class``: with ``k``, the K samples are spread evenly over the classes (each class gives its
    weakest); with ``fraction``, each class gives its weakest ``ceil(fraction N_c)``; with ``threshold``, the
    same number of samples the threshold selects is drawn class-balanced from the ranking.
    ``correct_only``: rank only the samples the model classifies correctly clean (misclassified training
    samples are wrong under every perturbation, so they carry no robustness signal of their own).
    """
    given = [v is not None for v in (k, fraction, threshold)]
    if sum(given) > 1:
        raise ConfigError("give only one of k, fraction, threshold")
    if not any(given):
        threshold = 0.5
    order = analysis.order()
    if correct_only:
        order = order[analysis.clean_correct[order]]
    n = len(order)
    labels = analysis.label
    if k is not None:
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        k = min(int(k), n)
        sel = _balanced_take(order, labels, k) if per_class else order[:k]
        rule: dict[str, Any] = {"rule": "top_k", "k": k}
    elif fraction is not None:
        if not 0 < fraction <= 1:
            raise ConfigError(f"fraction must lie in (0, 1], got {fraction}")
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
        if not 0 <= threshold < 1:
            raise ConfigError(f"threshold must lie in [0, 1), got {threshold}")
        over = analysis.frac_misclassified[order] > threshold
        m = int(over.sum())
        sel = _balanced_take(order, labels, m) if per_class else order[over]
        rule = {"rule": "threshold", "threshold": float(threshold)}
    rule["per_class"] = bool(per_class)
    rule["correct_only"] = bool(correct_only)
    rule["n_analysed"] = len(analysis)
    rule["analysis"] = dict(analysis.params)
    return WeakSet(indices=analysis.index[sel].clone(), scores=analysis.score[sel].clone(),
                   frac_misclassified=analysis.frac_misclassified[sel].clone(), labels=labels[sel].clone(),
                   rule=rule)

