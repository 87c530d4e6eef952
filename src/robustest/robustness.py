"""Robustness measurement: clean accuracy, accuracy on a fixed adversarial test set, white-box robust
accuracy of the current model, and accuracy under common corruptions.

Every function takes a model and data in the robustest contract (images in [0, 1], int64 labels), runs
batched on the model's device and returns plain numbers or dataclasses that serialise to JSON.
"""

from __future__ import annotations


# ===================================================================== corruption accuracy (common corruptions)
# Accuracy under the 19 common corruptions (robustest.corruptions) at severities 1-5.
# Section owned by the corruptions module; keep other measurements outside these delimiters.
from dataclasses import dataclass as _c_dataclass
from dataclasses import field as _c_field
from typing import Any as _CAny


@_c_dataclass
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
    error: dict[str, dict[int, float]] = _c_field(default_factory=dict)
    mean_accuracy: dict[str, float] = _c_field(default_factory=dict)
    mean_error: dict[str, float] = _c_field(default_factory=dict)
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

    def to_dict(self) -> dict[str, _CAny]:
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


def corruption_accuracy(model: _CAny, data: _CAny, corruptions: str | list[str] | tuple[str, ...] = "all",
                        severities: tuple[int, ...] | list[int] = (1, 2, 3, 4, 5), seed: int = 0,
                        batch_size: int = 256, *, table: str | None = None,
                        device: _CAny = None) -> CorruptionResult:
    """Top-1 accuracy of ``model`` on ``data`` under each corruption and severity.

    ``data``: anything :func:`robustest.runtime.iter_batches` takes with labels (images N x C x H x W in
    [0, 1], int64 labels [N]). Each batch is corrupted on the model's device with
    ``robustest.corruptions.corrupt(x, name, severity, seed=seed + batch_start)``, so results do not
    depend on the batch size only up to the noise draw (same ``seed`` and ``batch_size``: same result).
    ``corruptions`` is ``"all"`` (the 19 of :func:`robustest.corruptions.names`), one name or a list.
    ``table`` forces the parameter table (``"cifar"`` / ``"imagenet"``; default chosen by image size).
    """
    import torch

    from robustest import corruptions as _corr
    from robustest.errors import ConfigError as _CfgErr
    from robustest.errors import DataError as _DataErr
    from robustest.runtime import check_images, check_labels, eval_mode, iter_batches, resolve_device

    names = _corr.resolve_names(corruptions)
    sevs = tuple(int(s) for s in severities)
    if not sevs:
        raise _CfgErr("severities is empty: give at least one of 1-5")
    for s in sevs:
        if s not in (1, 2, 3, 4, 5):
            raise _CfgErr(f"severity {s} is outside 1-5")
    if batch_size < 1:
        raise _CfgErr(f"batch_size must be >= 1, got {batch_size}")
    dev = resolve_device(model, device)
    correct = {c: dict.fromkeys(sevs, 0) for c in names}
    clean_correct = 0
    n = 0
    with eval_mode(model), torch.no_grad():
        for idx, xb, yb in iter_batches(data, batch_size, dev, with_index=True):
            if yb is None:
                raise _DataErr("corruption_accuracy needs labels: pass (x, y) or a labelled data set")
            check_images(xb)
            check_labels(yb, xb.shape[0])
            start = int(idx[0]) if len(idx) else 0
            xb = xb.float()
            clean_correct += int((model(xb).argmax(1) == yb).sum())
            for c in names:
                for s in sevs:
                    xc = _corr.corrupt(xb, c, s, seed=seed + start, table=table)
                    correct[c][s] += int((model(xc).argmax(1) == yb).sum())
            n += xb.shape[0]
    if n == 0:
        raise _DataErr("the data set is empty: check the split and the path")
    acc = {c: {s: correct[c][s] / n for s in sevs} for c in names}
    used_table = table
    if used_table is None:
        x0, _ = next(iter(iter_batches(data, 1)))
        used_table = _corr.default_table(x0.shape[-2], x0.shape[-1])
    return CorruptionResult(accuracy=acc, clean_accuracy=clean_correct / n, num_samples=n, severities=sevs,
                            seed=seed, table=used_table)
# ================================================================ end corruption accuracy (common corruptions)
