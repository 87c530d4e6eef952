"""Training, evaluation and safe checkpoints.

* :func:`fit` trains a classifier with Adam or SGD, optional LR schedule and validation, seeded.
* :func:`accuracy` / :func:`predict` evaluate in batches on the model's device, restoring its mode.
* :func:`save_checkpoint` / :func:`load_checkpoint` store weights + model spec + metadata in one file and
  load it with ``torch.load(weights_only=True)``; anything else (a whole pickled model, a random file) is
  refused. TorchScript archives load only when asked for explicitly.
"""

from __future__ import annotations

import math
import os
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from robustest import models as zoo
from robustest.errors import CheckpointError, ConfigError, DataError
from robustest.runtime import (
    DataLike,
    as_tensors,
    atomic_save,
    check_images,
    check_labels,
    eval_mode,
    forward,
    iter_batches,
    make_generator,
    resolve_device,
    seed_everything,
)
from robustest.runtime import (
    progress as progress_bar,
)

__all__ = ["EpochStats", "History", "accuracy", "evaluate", "fit", "load_checkpoint", "predict", "save_checkpoint"]

CHECKPOINT_FORMAT = "robustest-checkpoint"
CHECKPOINT_VERSION = 1


@dataclass
class EpochStats:
    """Figures of one training epoch (val_* are None without validation data)."""

    epoch: int
    loss: float
    accuracy: float
    lr: float
    seconds: float
    val_loss: float | None = None
    val_accuracy: float | None = None


@dataclass
class History:
    """Per-epoch statistics of a :func:`fit` run; ``best_epoch`` is set when weights were restored."""

    epochs: list[EpochStats] = field(default_factory=list)
    best_epoch: int | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"epochs": [asdict(e) for e in self.epochs], "best_epoch": self.best_epoch, "seconds": self.seconds}

    @property
    def last(self) -> EpochStats:
        return self.epochs[-1]


def _make_optimizer(model: nn.Module, optimizer: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay, nesterov=True)
    raise ConfigError(f"unknown optimizer {optimizer!r}: use 'adam' or 'sgd'")


def _make_schedule(opt: torch.optim.Optimizer, schedule: str | None, epochs: int, steps_per_epoch: int):
    if schedule in (None, "none", "constant"):
        return None
    total = max(1, epochs * steps_per_epoch)
    if schedule == "cosine":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    if schedule == "step":  # x0.1 at 50% and 75% of training
        return torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.1 ** ((s >= 0.5 * total) + (s >= 0.75 * total)))
    raise ConfigError(f"unknown schedule {schedule!r}: use None, 'cosine' or 'step'")


def fit(
    model: nn.Module,
    train: DataLike,
    epochs: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    optimizer: str = "adam",
    weight_decay: float = 0.0,
    schedule: str | None = None,
    val: DataLike | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = True,
    restore_best: bool = False,
    on_epoch_end: Any = None,
) -> History:
    """Train ``model`` in place on ``train`` ((x, y) pair, Dataset or DataLoader) for ``epochs`` epochs.

    Shuffling, dropout and initial randomness come from ``seed``. With ``val`` given, each epoch records
    validation loss/accuracy, and ``restore_best=True`` restores the weights of the epoch with the best
    validation accuracy (the last epoch's figures stay in the history). The model ends in eval mode.
    ``on_epoch_end(epoch, model, stats)``, when given, is called after every epoch (model in train mode).
    Returns the :class:`History`.
    """
    if epochs < 0:
        raise ConfigError(f"epochs must be >= 0, got {epochs}")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if lr <= 0:
        raise ConfigError(f"lr must be positive, got {lr}")
    if restore_best and val is None:
        raise ConfigError("restore_best needs validation data (val=...)")
    dev = resolve_device(model, device)
    model.to(dev)
    seed_everything(seed)
    x, y = as_tensors(train)
    if y is None:
        raise ConfigError("training data needs labels: pass (x, y) or a labelled Dataset")
    check_images(x, "training images")
    check_labels(y, x.shape[0], name="training labels")
    if x.shape[0] == 0:
        raise DataError("the training data is empty: check the split, the path and --limit")
    with torch.no_grad(), eval_mode(model):  # labels must index the model's outputs (else an IndexError)
        num_classes = forward(model, x[:1].to(dev)).shape[-1]
    check_labels(y, x.shape[0], num_classes, name="training labels")
    n = x.shape[0]
    steps = math.ceil(n / batch_size)
    opt = _make_optimizer(model, optimizer, lr, weight_decay)
    sched = _make_schedule(opt, schedule, epochs, steps)
    gen = make_generator(seed)
    history = History()
    best_acc, best_state = -1.0, None
    t_start = time.perf_counter()
    for epoch in progress_bar(range(1, epochs + 1), enabled=progress, desc="train", unit="epoch"):
        t0 = time.perf_counter()
        model.train()
        perm = torch.randperm(n, generator=gen)
        total_loss, correct = 0.0, 0
        for s in range(0, n, batch_size):
            idx = perm[s:s + batch_size]
            xb, yb = x[idx].to(dev, non_blocking=True), y[idx].to(dev, non_blocking=True)
            logits = forward(model, xb)
            loss = F.cross_entropy(logits, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            total_loss += float(loss.detach()) * len(idx)
            correct += int((logits.detach().argmax(1) == yb).sum())
        stats = EpochStats(epoch=epoch, loss=total_loss / n, accuracy=correct / n,
                           lr=opt.param_groups[0]["lr"], seconds=0.0)
        if val is not None:
            stats.val_loss, stats.val_accuracy = evaluate(model, val, batch_size=max(256, batch_size))
            if restore_best and stats.val_accuracy > best_acc:
                best_acc = stats.val_accuracy
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                history.best_epoch = epoch
        stats.seconds = time.perf_counter() - t0
        history.epochs.append(stats)
        if on_epoch_end is not None:  # e.g. keep the last epoch's weights when restore_best is used
            on_epoch_end(epoch, model, stats)
    if restore_best and best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    history.seconds = time.perf_counter() - t_start
    return history


@torch.no_grad()
def predict(model: nn.Module, data: DataLike, batch_size: int = 512, device: torch.device | str | None = None
            ) -> torch.Tensor:
    """Logits of ``model`` on ``data`` (N x K, on CPU), computed in eval mode (mode restored)."""
    dev = resolve_device(model, device)
    outs = []
    with eval_mode(model):
        for xb, _ in iter_batches(data, batch_size, dev):
            outs.append(forward(model, xb).float().cpu())
    return torch.cat(outs) if outs else torch.empty(0)


@torch.no_grad()
def evaluate(model: nn.Module, data: DataLike, batch_size: int = 512, device: torch.device | str | None = None
             ) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on labelled ``data``, in eval mode (mode restored)."""
    dev = resolve_device(model, device)
    total, correct, n = 0.0, 0, 0
    with eval_mode(model):
        for xb, yb in iter_batches(data, batch_size, dev):
            if yb is None:
                raise ConfigError("evaluation needs labels: pass (x, y) or a labelled Dataset")
            logits = forward(model, xb)
            total += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(1) == yb).sum())
            n += len(yb)
    if n == 0:
        raise ConfigError("cannot evaluate on an empty data set")
    return total / n, correct / n


def accuracy(model: nn.Module, data: DataLike, batch_size: int = 512, device: torch.device | str | None = None
             ) -> float:
    """Top-1 accuracy in [0, 1] of ``model`` on labelled ``data``."""
    return evaluate(model, data, batch_size, device)[1]


# ------------------------------------------------------------------------------------------ checkpoints
def save_checkpoint(path: str | os.PathLike[str], model: nn.Module, spec: dict[str, Any] | None = None,
                    metadata: dict[str, Any] | None = None) -> Path:
    """Atomically write weights + model spec + metadata to ``path`` (a ``torch.save`` of plain data).

    ``spec`` defaults to the spec of a zoo model (``robustest.models.spec_of``). Metadata must be plain
    data (numbers, strings, lists, dicts) so the file loads with ``weights_only=True``.
    """
    spec = dict(spec) if spec is not None else zoo.spec_of(model)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "spec": spec,
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "metadata": _plain_metadata(dict(metadata or {})),
    }
    return atomic_save(payload, path)


def _plain_metadata(obj: Any, where: str = "metadata") -> Any:
    """``obj`` as data that ``torch.load(weights_only=True)`` accepts: NumPy values become Python numbers or
    lists and paths strings; tensors and plain containers stay; anything else is a :class:`ConfigError`."""
    import numpy as np

    if obj is None or type(obj) in (bool, int, float, str, bytes) or isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, np.generic):
        return _plain_metadata(obj.item(), where)
    if isinstance(obj, np.ndarray):
        return _plain_metadata(obj.tolist(), where)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    for plain in (bool, int, float, str):  # subclasses (e.g. enums) would pickle their class
        if isinstance(obj, plain):
            return plain(obj)
    if isinstance(obj, dict):
        return {_plain_metadata(k, where): _plain_metadata(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        vals = [_plain_metadata(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return vals if isinstance(obj, list) else tuple(vals)
    raise ConfigError(f"{where} holds a {type(obj).__name__}, which a safe checkpoint cannot store: "
                      "use numbers, strings, lists, dicts or tensors")


def _is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
    return any(n.endswith("/constants.pkl") or "/code/" in n for n in names)


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu",
                    torchscript: bool = False) -> nn.Module:
    """Load a robustest checkpoint and return the rebuilt model in eval mode.

    The file is read with ``torch.load(weights_only=True)``: only tensors and plain data are accepted,
    never arbitrary pickled objects. ``model.robustest_metadata`` holds the stored metadata. With
    ``torchscript=True`` a TorchScript archive is loaded with ``torch.jit.load`` instead (trusted files
    only). Raises :class:`CheckpointError` for anything that is not a robustest checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist: pass a model.pt from 'robustest train'")
    if isinstance(map_location, (str, torch.device)):  # an unusable device is a ConfigError, not a bad file
        resolve_device(None, map_location)
    if _is_torchscript(path):
        if not torchscript:
            raise CheckpointError(f"{path} is a TorchScript archive: load it explicitly with torchscript=True "
                                  "(--torchscript), only if you trust its source")
        model = torch.jit.load(str(path), map_location=map_location)
        model.robustest_metadata = {}  # type: ignore[attr-defined]
        return model.eval()
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - every failure is a refused file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "unsupported global" in str(exc).lower():  # a pickled class or function; random bytes fail otherwise
            raise CheckpointError(
                f"{path} holds pickled Python objects (a whole saved model?), which are refused for safety: "
                "save a robustest checkpoint with save_checkpoint/'robustest train'"
            ) from exc
        if "WeightsUnpickler error:" in str(exc):  # keep torch's detail, drop its advice to disable safety
            first = str(exc).split("WeightsUnpickler error:", 1)[1].strip().splitlines()[0]
        elif first.startswith("Weights only load failed"):
            first = "the safe loader refused its content"
        raise CheckpointError(f"{path} is not a robustest checkpoint (cannot be read: {first[:120]}); "
                              "the file is corrupt, truncated or of another format") from exc
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a robustest checkpoint (a bare state_dict or another format): "
                              "save one with save_checkpoint/'robustest train'")
    if int(payload.get("version", 0)) > CHECKPOINT_VERSION:
        raise CheckpointError(f"{path} was written by a newer robustest (format {payload['version']}): upgrade")
    spec = payload.get("spec")
    if not isinstance(spec, dict) or "name" not in spec:
        raise CheckpointError(f"{path}: checkpoint has no model spec")
    kwargs = {k: spec[k] for k in ("num_classes", "in_channels", "input_size", "mean", "std") if k in spec}
    try:
        model = zoo.create(spec["name"], **kwargs)
    except ConfigError as exc:
        raise CheckpointError(f"{path}: cannot rebuild model: {exc}") from exc
    try:
        model.load_state_dict(payload["state_dict"])
    except (RuntimeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: weights do not fit model {spec['name']!r} (corrupt checkpoint?)") from exc
    model.robustest_metadata = dict(payload.get("metadata") or {})  # type: ignore[assignment]
    return model.to(map_location).eval()


from robustest.hardening import harden  # noqa: E402,F401  (training.harden: adversarial fine-tuning)
