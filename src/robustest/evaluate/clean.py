"""Clean measurement: (loss, accuracy) and top-1 accuracy of a model on labelled data (its logits:
:func:`robustest.core.modelcall.predict`).

Every function runs in batches on the model's device, in eval mode, and restores the model's mode.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.batching import DataLike, as_tensors, iter_batches
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError, DataError
from robustest.core.inputs import check_images, check_labels
from robustest.core.modelcall import eval_mode, forward

__all__ = ["accuracy", "clean_accuracy", "labelled_tensors", "loss_and_accuracy"]


@torch.no_grad()
def loss_and_accuracy(model: nn.Module, data: DataLike, batch_size: int = 512,
                      device: torch.device | str | None = None) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on labelled ``data``, in eval mode (mode restored). Every batch
    is checked as :func:`robustest.evaluate.evaluate` checks its input (float images in [0, 1], integer labels):
    pixels in 0..255 or uint8 are a one-line DataError, not a plausible wrong figure."""
    dev = resolve_device(model, device)
    total, correct, n = 0.0, 0, 0
    with eval_mode(model):
        for xb, yb in iter_batches(data, batch_size, dev):
            if yb is None:
                raise ConfigError("evaluation needs labels: pass (x, y) or a labelled Dataset")
            check_images(xb)  # the checks and one-line errors of evaluate: images, then labels against the logits
            logits = forward(model, xb)
            check_labels(yb, int(xb.shape[0]), int(logits.shape[-1]))
            total += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(1) == yb).sum())
            n += len(yb)
    if n == 0:
        raise ConfigError("cannot evaluate on an empty data set")
    return total / n, correct / n


def accuracy(model: nn.Module, data: DataLike, batch_size: int = 512, device: torch.device | str | None = None
             ) -> float:
    """Top-1 accuracy in [0, 1] of ``model`` on labelled ``data``."""
    return loss_and_accuracy(model, data, batch_size, device)[1]


def labelled_tensors(data: Any, name: str = "data") -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` of labelled ``data`` as tensors (images N x C x H x W in [0, 1], int64 labels [N]), checked;
    a one-line DataError when it has no labels."""
    x, y = as_tensors(data)
    if y is None:
        raise DataError(f"{name} needs labels: pass (x, y) or a labelled Dataset")
    check_images(x, name)
    check_labels(y, x.shape[0], name=f"{name} labels")
    return x, y


def clean_accuracy(model: Any, data: Any, *, batch_size: int = 256) -> float:
    """Top-1 accuracy in [0, 1] of ``model`` on labelled ``data`` (images N x C x H x W in [0, 1])."""
    x, y = labelled_tensors(data)
    return float(accuracy(model, (x, y), batch_size=batch_size))
