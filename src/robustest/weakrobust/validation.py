"""Validation (METHODS B2): the error of a model on a set of samples under gradient attacks and common
corruptions, every perturbation type labelled a strength or a weakness."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from robustest.core import reprs
from robustest.core.atomic import atomic_save
from robustest.core.batching import DataLike, num_samples, take
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError, DataError
from robustest.core.inputs import check_images, check_labels
from robustest.core.modelcall import eval_mode, forward
from robustest.core.progress import progress as progress_bar
from robustest.core.reading import load_plain
from robustest.weakrobust.weakset import WeakSet

ATTACKS = ("fgsm", "pgd", "bim", "rfgsm", "mifgsm")
"""The gradient attacks :func:`validate` runs by default."""


def default_eps_grid(channels: int) -> tuple[float, ...]:
    """L-inf budgets used by default: (0.05, 0.1, 0.2) for 1-channel images (MNIST-like), else 2/255, 4/255,
    8/255 (colour images, as in the paper)."""
    return (0.05, 0.1, 0.2) if channels == 1 else (2 / 255, 4 / 255, 8 / 255)


@dataclass
class ValidationResult:
    """Per-sample outcome of every perturbation (type, level) on a set of N samples.

    ``keys``: list of ``(family, type, level)`` with family ``"clean"``, ``"attack"`` (level = eps) or
    ``"corruption"`` (level = severity); ``wrong``: BoolTensor [len(keys), N], True where the prediction on
    the perturbed sample is not the label; ``indices``: the samples' positions in the data set; ``weights``:
    None (every sample counts the same) or float64 [N] (a stratified set's weights, see
    :func:`~robustest.weakrobust.select_weak`): every error is then the weighted mean of the outcomes.
    Aggregates (:meth:`summary`): top-1 error per (type, level), per type (mean over levels), clean error,
    mean corruption error (mCE, unnormalised mean over corruption types), mean adversarial error (mean over
    attack types), and every type labelled ``weakness`` or ``strength`` by :meth:`labels`.
    """

    keys: list[tuple[str, str, float]]
    wrong: torch.Tensor
    indices: torch.Tensor
    labels_y: torch.Tensor
    meta: dict[str, Any] = field(default_factory=dict)
    weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.weights is not None:
            w = torch.as_tensor(self.weights, dtype=torch.float64).reshape(-1)
            if w.shape[0] != self.wrong.shape[1] or not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
                raise DataError(f"weights must be {self.wrong.shape[1]} finite non-negative numbers, one per sample")
            self.weights = w

    @property
    def weighted(self) -> bool:
        return self.weights is not None

    def __len__(self) -> int:
        return int(self.wrong.shape[1])

    def __repr__(self) -> str:
        families = [f for f, _t, _l in self.keys]
        return reprs.one_line(self, n=len(self), attack_runs=families.count("attack"),
                              corruption_runs=families.count("corruption"), clean_error=self.clean_error,
                              mean_adv_error=self.mean_adv_error, mce=self.mce, weaknesses=len(self.weaknesses()))

    def subset(self, positions: torch.Tensor | Sequence[int],
               weights: torch.Tensor | Sequence[float] | None = None) -> ValidationResult:
        """The result restricted to some of its samples (positions 0..N-1 of this result), keeping their
        weights (if any); ``weights`` (one per position) replaces them, e.g. a stratified set's
        :attr:`WeakSet.weights` when this result covers every analysed sample."""
        p = torch.as_tensor(positions, dtype=torch.long)
        w = weights if weights is not None else (None if self.weights is None else self.weights[p])
        return ValidationResult(self.keys, self.wrong[:, p], self.indices[p], self.labels_y[p], dict(self.meta),
                                weights=None if w is None else torch.as_tensor(w, dtype=torch.float64))

    def errors(self) -> dict[tuple[str, str, float], float]:
        """(family, type, level) -> error: the share of wrong outcomes, or their weighted mean when weighted."""
        if self.weights is not None:
            w = self.weights / self.weights.sum().clamp(min=1e-300)
            e = (self.wrong.double() * w).sum(dim=1)
        else:
            e = self.wrong.double().sum(dim=1) / max(1, len(self))
        return {k: float(v) for k, v in zip(self.keys, e.tolist())}

    def per_type(self) -> dict[str, tuple[str, float]]:
        """type -> (family, error averaged over its levels)."""
        acc: dict[str, list] = {}
        for (fam, typ, _lvl), err in self.errors().items():
            acc.setdefault(typ, [fam, []])[1].append(err)
        return {t: (f, float(np.mean(v))) for t, (f, v) in acc.items()}

    def family_mean(self, family: str) -> float | None:
        vals = [e for f, e in self.per_type().values() if f == family]
        return float(np.mean(vals)) if vals else None

    @property
    def clean_error(self) -> float | None:
        return self.family_mean("clean")

    @property
    def mce(self) -> float | None:
        return self.family_mean("corruption")

    @property
    def mean_adv_error(self) -> float | None:
        return self.family_mean("attack")

    def labels(self, reference: ValidationResult | Mapping[str, float] | None = None) -> dict[str, str]:
        """Strength/weakness of every perturbation type.

        Without ``reference``: a type is a ``weakness`` when its error exceeds the mean error of its family
        (attacks are compared with attacks, corruptions with corruptions), else a ``strength``. With a
        ``reference`` (another model's result on the same samples, or type -> error): a weakness when the
        error exceeds the reference's error on that type.
        """
        pt = self.per_type()
        if reference is not None:
            ref = ({t: e for t, (_f, e) in reference.per_type().items()} if isinstance(reference, ValidationResult)
                   else dict(reference))
        out = {}
        for t, (fam, err) in pt.items():
            if fam == "clean":
                continue
            base = ref.get(t) if reference is not None else self.family_mean(fam)
            if base is None:
                continue
            out[t] = "weakness" if err > base else "strength"
        return out

    def weaknesses(self, reference: ValidationResult | Mapping[str, float] | None = None) -> list[str]:
        return [t for t, v in self.labels(reference).items() if v == "weakness"]

    def rows(self) -> list[dict[str, Any]]:
        """One row per (type, level): family, type, level, error."""
        return [{"family": f, "type": t, "level": lvl, "error": e} for (f, t, lvl), e in self.errors().items()]

    def summary(self, reference: ValidationResult | Mapping[str, float] | None = None) -> dict[str, Any]:
        lab = self.labels(reference)
        return {
            "n": len(self),
            "weighted": self.weighted,
            "clean_error": self.clean_error,
            "mce": self.mce,
            "mean_adv_error": self.mean_adv_error,
            "per_type": {t: {"family": f, "error": e, "label": lab.get(t)} for t, (f, e) in self.per_type().items()},
            "label_rule": "reference" if reference is not None else "family_mean",
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "rows": self.rows(), "meta": dict(self.meta)}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Per-sample outcomes as plain tensors (``.pt``)."""
        d = {"format": "robustest-validation", "keys": [list(k) for k in self.keys], "wrong": self.wrong,
             "indices": self.indices, "labels": self.labels_y, "meta": dict(self.meta)}
        if self.weights is not None:
            d["weights"] = self.weights
        return atomic_save(d, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ValidationResult:
        """Read a file written by :meth:`save` (safely: plain tensors and containers only)."""
        d = load_plain(path, fmt="robustest-validation", what="robustest validation file",
                       fix="write one with ValidationResult.save")
        keys = [(str(f), str(t), float(lvl)) for f, t, lvl in d["keys"]]
        return cls(keys=keys, wrong=d["wrong"].bool(), indices=d["indices"].long(), labels_y=d["labels"].long(),
                   meta=dict(d.get("meta") or {}), weights=d.get("weights"))


def _parse_perturbations(perturbations: str | Sequence[str] | None) -> tuple[list[str], list[str]]:
    """Split a spec ("all", "attacks", "corruptions", or a list of names) into (attacks, corruptions)."""
    from robustest import corruptions as corr

    cnames = list(corr.names())
    if perturbations is None or perturbations == "all":
        return list(ATTACKS), cnames
    items = [perturbations] if isinstance(perturbations, str) else list(perturbations)
    atk, cor = [], []
    for it in items:
        for name in str(it).split(","):
            name = name.strip()
            if not name:
                continue
            if name == "all":
                atk += [a for a in ATTACKS if a not in atk]
                cor += [c for c in cnames if c not in cor]
            elif name == "attacks":
                atk += [a for a in ATTACKS if a not in atk]
            elif name == "corruptions":
                cor += [c for c in cnames if c not in cor]
            elif name in ATTACKS or name in _attack_names():
                if name not in atk:
                    atk.append(name)
            elif name in cnames:
                if name not in cor:
                    cor.append(name)
            else:
                raise ConfigError(f"unknown perturbation {name!r}: use 'all', 'attacks', 'corruptions', an attack "
                                  f"({', '.join(ATTACKS)}) or a corruption ({', '.join(cnames)})")
    return atk, cor


def _attack_names() -> list[str]:
    from robustest import attacks

    return list(attacks.names())


@torch.no_grad()
def _wrong(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int, dev: torch.device) -> torch.Tensor:
    out = []
    for s in range(0, x.shape[0], batch_size):
        xb = x[s:s + batch_size].to(dev)
        out.append((forward(model, xb).argmax(1) != y[s:s + batch_size].to(dev)).cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool)


def validate(
    model: nn.Module,
    data: DataLike,
    weak_set: WeakSet | torch.Tensor | Sequence[int] | None = None,
    perturbations: str | Sequence[str] | None = "all",
    *,
    eps: Sequence[float] | None = None,
    severities: Sequence[int] = (1, 2, 3, 4, 5),
    attack_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    batch_size: int = 256,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    weights: torch.Tensor | Sequence[float] | None = None,
) -> ValidationResult:
    """Error of ``model`` on the samples ``weak_set`` of ``data`` under each perturbation (METHODS B2).

    ``weak_set``: a :class:`WeakSet`, positions into ``data``, or None for every sample (e.g. a test split).
    ``weights``: one non-negative weight per sample (default: the weak set's own, which a ``stratified`` set
    has); errors are then weighted means (:class:`ValidationResult`).
    ``perturbations``: ``"all"`` (default), ``"attacks"``, ``"corruptions"``, or names of attacks
    (:data:`ATTACKS` and any other ``robustest.attacks`` name) and corruptions (``robustest.corruptions``).
    Attacks run white-box at every budget of ``eps`` (default :func:`default_eps_grid`) with the attack's
    defaults (``attack_kwargs[name]`` overrides them); corruptions at every severity. Error = fraction of
    samples whose prediction on the perturbed input is not the label (clean mistakes count as errors).
    Returns a :class:`ValidationResult` holding the per-sample outcomes.
    """
    from robustest import attacks as atk_mod
    from robustest import corruptions as corr

    n_all = num_samples(data)
    if weights is None and isinstance(weak_set, WeakSet):
        weights = weak_set.weights
    if weak_set is None:
        idx = torch.arange(n_all)
    elif isinstance(weak_set, WeakSet):
        idx = weak_set.indices
    else:
        idx = torch.as_tensor(weak_set, dtype=torch.long).reshape(-1)
    if idx.numel() == 0:
        raise DataError("the weak set is empty: select with a lower threshold or give k / fraction")
    if int(idx.max()) >= n_all or int(idx.min()) < 0:
        raise DataError(f"weak set indices reach {int(idx.max())} but the data set has {n_all} samples: "
                        "validate on the data set that was analysed")
    if weights is not None:
        weights = torch.as_tensor(weights, dtype=torch.float64).reshape(-1)
        if weights.shape[0] != idx.numel() or not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()) \
                or float(weights.sum()) <= 0:
            raise ConfigError(f"weights must be {idx.numel()} finite non-negative numbers (one per sample, not all 0)")
    x, y = take(data, idx)  # only these samples are read: the indices refer to the data set, whatever its order
    if y is None:
        raise DataError("validate needs labels: pass (x, y) or a labelled Dataset")
    check_images(x, "data images")
    y = check_labels(torch.as_tensor(y), x.shape[0], name="data labels").long()
    attacks_, corrs = _parse_perturbations(perturbations)
    grid = tuple(float(e) for e in (eps if eps is not None else default_eps_grid(x.shape[1])))
    sev = tuple(int(s) for s in severities)
    if any(s < 1 or s > 5 for s in sev):
        raise ConfigError(f"severities must lie in 1..5, got {sev}")
    dev = resolve_device(model, device)
    keys: list[tuple[str, str, float]] = [("clean", "clean", 0.0)]
    rows: list[torch.Tensor] = []
    t0 = time.perf_counter()
    jobs: list[tuple[str, str, float]] = [("attack", a, e) for a in attacks_ for e in grid]
    jobs += [("corruption", c, float(s)) for c in corrs for s in sev]
    with eval_mode(model):
        rows.append(_wrong(model, x, y, batch_size, dev))
        for fam, name, lvl in progress_bar(jobs, enabled=progress, desc="validate", unit="type"):
            if fam == "attack":
                kw = dict((attack_kwargs or {}).get(name, {}))
                res = atk_mod.attack(name, model, (x, y), batch_size=batch_size, eps=lvl, seed=seed, **kw)
                rows.append(res.success.reshape(-1).bool().cpu())
            else:
                parts = []
                for b, s in enumerate(range(0, x.shape[0], batch_size)):
                    xc = corr.corrupt(x[s:s + batch_size].to(dev), name, int(lvl), seed=seed + b)
                    parts.append(_wrong(model, xc, y[s:s + batch_size], batch_size, dev))
                rows.append(torch.cat(parts))
            keys.append((fam, name, lvl))
    meta = {"eps": list(grid), "severities": list(sev), "attacks": attacks_, "corruptions": corrs, "seed": seed,
            "seconds": time.perf_counter() - t0}
    return ValidationResult(keys=keys, wrong=torch.stack(rows), indices=idx.clone(), labels_y=y.clone(), meta=meta,
                            weights=None if weights is None else weights.clone())

