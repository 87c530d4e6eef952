"""Accuracy under common corruptions: the 19 corruptions of :mod:`robustest.corruptions` at severities 1-5, or
published -C data sets, and the mean corruption error (mCE) against a baseline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from robustest import corruptions as _corr
from robustest.core.batching import iter_batches, num_samples
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError, DataError
from robustest.core.inputs import check_images, check_labels
from robustest.core.modelcall import eval_mode, forward
from robustest.core.reprs import Raw, one_line
from robustest.evaluate.clean import accuracy

__all__ = ["CorruptionResult", "corruption_accuracy", "corruption_summary", "published_corruptions"]


@dataclass
class CorruptionResult:
    """Accuracy of a model under common corruptions.

    ``accuracy[name][severity]`` is top-1 accuracy in [0, 1] on the corrupted data; ``error`` is
    ``1 - accuracy``. ``mean_error[name]`` averages a corruption's errors over the severities;
    ``mce`` (mean corruption error, unnormalised) averages ``mean_error`` over corruptions.
    ``clean_accuracy`` is the accuracy on the uncorrupted data.
    """

    accuracy: dict[str, dict[int, float]]
    clean_accuracy: float
    num_samples: int
    severities: tuple[int, ...]
    seed: int
    error: dict[str, dict[int, float]] = field(default_factory=dict)
    mean_accuracy: dict[str, float] = field(default_factory=dict)
    mean_error: dict[str, float] = field(default_factory=dict)
    mce: float = float("nan")
    mean_corruption_accuracy: float = float("nan")
    table: str | None = None

    def __post_init__(self) -> None:
        self.error = {c: {s: 1.0 - a for s, a in per.items()} for c, per in self.accuracy.items()}
        self.mean_accuracy = {c: sum(per.values()) / len(per) for c, per in self.accuracy.items() if per}
        self.mean_error = {c: 1.0 - a for c, a in self.mean_accuracy.items()}
        if self.mean_error:
            self.mce = sum(self.mean_error.values()) / len(self.mean_error)
            self.mean_corruption_accuracy = 1.0 - self.mce

    def __repr__(self) -> str:
        return one_line(self, clean_accuracy=self.clean_accuracy, mce=self.mce, corruptions=len(self.accuracy),
                        severities=Raw(str(tuple(self.severities))), num_samples=self.num_samples, table=self.table)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (severity keys as strings)."""
        return {
            "clean_accuracy": self.clean_accuracy,
            "num_samples": self.num_samples,
            "severities": list(self.severities),
            "seed": self.seed,
            "table": self.table,
            "accuracy": {c: {str(s): a for s, a in per.items()} for c, per in self.accuracy.items()},
            "error": {c: {str(s): e for s, e in per.items()} for c, per in self.error.items()},
            "mean_accuracy": dict(self.mean_accuracy),
            "mean_error": dict(self.mean_error),
            "mce": self.mce,
            "mean_corruption_accuracy": self.mean_corruption_accuracy,
        }


def corruption_accuracy(model: Any, data: Any, corruptions: str | list[str] | tuple[str, ...] = "all",
                        severities: tuple[int, ...] | list[int] = (1, 2, 3, 4, 5), seed: int = 0,
                        batch_size: int = 256, *, table: str | None = None,
                        device: Any = None) -> CorruptionResult:
    """Top-1 accuracy of ``model`` on ``data`` under each corruption and severity.

    ``data``: anything :func:`robustest.core.batching.iter_batches` takes with labels (images N x C x H x W in
    [0, 1], int64 labels [N]). Each batch is corrupted on the model's device with
    ``robustest.corruptions.corrupt(x, name, severity, seed=seed + batch_start)``, the batching of the
    ``robustest corrupt`` verb: the same ``seed`` and ``batch_size`` give the same result (another
    batch size draws other, equally distributed noise).
    ``corruptions`` is ``"all"`` (the 19 of :func:`robustest.corruptions.names`), one name or a list.
    ``table`` forces the parameter table (``"cifar"`` / ``"imagenet"``; default chosen by image size).
    """
    names = _corr.resolve_names(corruptions)
    sevs = tuple(int(s) for s in severities)
    if not sevs:
        raise ConfigError("severities is empty: give at least one of 1-5")
    for s in sevs:
        if s not in (1, 2, 3, 4, 5):
            raise ConfigError(f"severity {s} is outside 1-5")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    dev = resolve_device(model, device)
    correct = {c: dict.fromkeys(sevs, 0) for c in names}
    clean_correct = 0
    n = 0
    with eval_mode(model), torch.no_grad():
        for idx, xb, yb in iter_batches(data, batch_size, dev, with_index=True):
            if yb is None:
                raise DataError("corruption_accuracy needs labels: pass (x, y) or a labelled data set")
            check_images(xb)
            check_labels(yb, xb.shape[0])
            start = int(idx[0]) if len(idx) else 0
            xb = xb.float()
            clean_correct += int((forward(model, xb).argmax(1) == yb).sum())
            for c in names:
                for s in sevs:
                    xc = _corr.corrupt(xb, c, s, seed=seed + start, table=table)
                    correct[c][s] += int((forward(model, xc).argmax(1) == yb).sum())
            n += xb.shape[0]
    if n == 0:
        raise DataError("the data set is empty: check the split and the path")
    acc = {c: {s: correct[c][s] / n for s in sevs} for c in names}
    used_table = table
    if used_table is None:
        x0, _ = next(iter(iter_batches(data, 1)))
        used_table = _corr.default_table(x0.shape[-2], x0.shape[-1])
    return CorruptionResult(accuracy=acc, clean_accuracy=clean_correct / n, num_samples=n, severities=sevs,
                            seed=seed, table=used_table)


def corruption_summary(res: CorruptionResult, base: CorruptionResult | None) -> dict[str, Any]:
    """Mean corruption accuracy / error and, with a baseline, Hendrycks & Dietterich's (2019) normalised mCE
    (mean over corruptions of sum_s E_model / sum_s E_baseline) and relative mCE
    (sum_s (E_model - E_model_clean) / sum_s (E_baseline - E_baseline_clean))."""
    out: dict[str, Any] = {
        "corruptions": list(res.accuracy), "severities": list(res.severities), "num_samples": res.num_samples,
        "table": res.table, "mean_corruption_accuracy": res.mean_corruption_accuracy,
        "mean_corruption_error": res.mce, "mce": None, "relative_mce": None,
        "accuracy": {c: {str(s): a for s, a in per.items()} for c, per in res.accuracy.items()},
        "result": res,
    }
    if base is None:
        return out
    missing = [(c, s) for c, per in res.accuracy.items() for s in per
               if c not in base.accuracy or s not in base.accuracy[c]]
    if missing:
        c, s = missing[0]
        raise ConfigError(f"the baseline has no result for {c} at severity {s}: measure it on the same corruptions")
    ce, rel = {}, {}
    for c, per in res.error.items():
        e_m = sum(per.values())
        e_b = sum(base.error[c][s] for s in per)
        ce[c] = e_m / e_b if e_b > 0 else float("nan")
        d_m = sum(e - (1.0 - res.clean_accuracy) for e in per.values())
        d_b = sum(base.error[c][s] - (1.0 - base.clean_accuracy) for s in per)
        rel[c] = d_m / d_b if d_b > 0 else float("nan")
    out.update(ce=ce, relative_ce=rel, mce=sum(ce.values()) / len(ce), relative_mce=sum(rel.values()) / len(rel),
               baseline_clean_accuracy=base.clean_accuracy, baseline_mean_corruption_error=base.mce,
               baseline_result=base)
    return out


def published_corruptions(model: nn.Module, sets: dict, clean_accuracy: float, batch_size: int
                          ) -> CorruptionResult:
    """A CorruptionResult from published -C data: ``sets[corruption][severity]`` is labelled data."""
    acc: dict[str, dict[int, float]] = {}
    n = 0
    sevs: set[int] = set()
    for c, per in sets.items():
        if not isinstance(per, dict) or not per:
            raise ConfigError(f"corruptions[{c!r}] must map severities (1-5) to labelled data")
        acc[str(c)] = {}
        for s, d in per.items():
            if int(s) not in (1, 2, 3, 4, 5):
                raise ConfigError(f"severity {s} of {c!r} is outside 1-5")
            acc[str(c)][int(s)] = float(accuracy(model, d, batch_size=batch_size))
            sevs.add(int(s))
            n = max(n, num_samples(d))
    return CorruptionResult(accuracy=acc, clean_accuracy=clean_accuracy, num_samples=n,
                            severities=tuple(sorted(sevs)), seed=0, table="published")
