"""The train pipeline: build a zoo model sized from the data, fit it, measure it on the test data, save it (what
``robustest train`` runs).

* :func:`sized_zoo_model`: a zoo architecture with random weights, sized from the data (channels, square side,
  number of classes), with the training set's per-channel mean and std inside it.
* :func:`train_pipeline`: :func:`robustest.train.fit` with validated :class:`Recipe`, test loss and accuracy,
  ``OUT/model.pt``; returns a :class:`TrainRun` whose :meth:`TrainRun.to_results` is the ``results`` of the train
  verb's results.json.

Example::

    model = sized_zoo_model("digits_cnn", train, test, seed=0)
    run = train_pipeline(model, train, test, out="digits", epochs=3, batch_size=64, recipe=Recipe(lr=2e-3))
    write_results("digits", "train", settings, run.to_results(), {**run.timings, "total_s": seconds})

(``run.timings`` hold the parts; results.json also records the whole run's ``total_s``.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from robustest.core.atomic import check_writable
from robustest.core.batching import image_shape, labels_of, num_samples, take
from robustest.core.errors import ConfigError
from robustest.core.memory import peak_rss_mib
from robustest.train.fitting import History, fit
from robustest.train.recipes import Recipe, as_recipe

__all__ = ["TrainRun", "same_data", "sized_zoo_model", "train_pipeline"]


def same_data(a: Any, b: Any) -> bool:
    """Whether two splits hold the same data (same size, same labels, same first 64 images): a folder without
    separate splits gives both."""
    n = num_samples(a)
    if n != num_samples(b):
        return False
    la, lb = labels_of(a), labels_of(b)
    if la is not None and lb is not None and not torch.equal(la, lb):
        return False
    k = torch.arange(min(n, 64))
    return bool(torch.equal(take(a, k)[0], take(b, k)[0]))


def _labels(data: Any) -> torch.Tensor:
    """The labels [N] of ``data``: its label tensor, else read through the batches."""
    y = labels_of(data)
    return y if y is not None else take(data, torch.arange(num_samples(data)))[1]


def sized_zoo_model(name: str, train: Any, test: Any, *, num_classes: int | None = None, normalize: bool = True,
                    options: dict[str, Any] | None = None, seed: int = 0,
                    device: torch.device | str = "cpu") -> nn.Module:
    """The zoo model ``name`` with random weights drawn after ``torch.manual_seed(seed)``, for the images of ``train``
    (N x C x H x W, H = W): C input channels, side H, ``num_classes`` classes (default: the largest label of
    ``train`` and ``test`` + 1, at least 2), and with ``normalize`` the training set's per-channel mean and std as
    its first layer. ``options``: the model's own options (robustest info --models). Raises ConfigError for
    non-square images or data the architecture cannot take, before the statistics pass over the data."""
    from robustest import models as zoo
    from robustest.train import channel_stats

    c, h, w = image_shape(train)
    if h != w:
        raise ConfigError(f"images must be square for the zoo models, got {h}x{w}: pass --resize H W")
    ys = [_labels(train)] + ([] if test is train else [_labels(test)])  # one pass when both are the same data
    k = max(num_classes or max(int(y.max()) for y in ys) + 1, 2)
    zoo.check_input(name, c, h, k, **(options or {}))
    mean = std = None
    if normalize:
        mean, std = channel_stats(train)
    torch.manual_seed(seed)
    return zoo.create(name, num_classes=k, in_channels=c, input_size=h, mean=mean, std=std,
                      **(options or {})).to(device)


@dataclass
class TrainRun:
    """What :func:`train_pipeline` did: the trained ``model``, its ``history``, test loss and accuracy, the
    sizes of both splits, whether the test split is the training data, the ``recipe`` that ran and ``timings``."""

    model: nn.Module
    history: History
    test_loss: float
    test_accuracy: float
    num_train: int
    num_test: int
    same_split: bool
    recipe: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)

    def summary_line(self, model: str, dataset: str) -> str:
        """The training in one line: ``model`` and ``dataset`` (their names), training images, epochs, the last
        epoch's loss and accuracy, test accuracy and training seconds (what ``robustest train`` prints)."""
        from robustest.report import format_value as fmt
        from robustest.report import plural

        last = self.history.last
        return (f"trained {model} on {dataset}: {self.num_train} images, {plural(self.recipe['epochs'], 'epoch')}, "
                f"train loss {fmt(last.loss)}, train accuracy {fmt(last.accuracy, 'accuracy')}, test accuracy "
                f"{fmt(self.test_accuracy, 'accuracy')} ({fmt(self.history.seconds, 'train_s')} s)")

    def to_results(self) -> dict[str, Any]:
        """The ``results`` of the train verb's results.json: the figures, the process's peak memory and the files
        written."""
        from robustest.models.checkpoints import source_of

        return {"model": source_of(self.model), "recipe": self.recipe, "num_train": self.num_train,
                "num_test": self.num_test, "history": self.history.to_dict(), "test_loss": self.test_loss,
                "test_accuracy": self.test_accuracy, "test_split_is_training_data": self.same_split,
                "peak_rss_mib": peak_rss_mib(), "files": {"model": "model.pt", "report": "report.html"}}


def train_pipeline(model: nn.Module, train: Any, test: Any, *, out: str | Path, epochs: int, batch_size: int,
                   recipe: Recipe | None = None, recipe_name: str | None = None, seed: int = 0,
                   device: torch.device | str = "cpu", progress: bool = True, resume: bool = False,
                   metadata: dict[str, Any] | None = None, note: Callable[[str], None] | None = None) -> TrainRun:
    """Fit ``model`` on ``train`` for ``epochs`` epochs of ``batch_size`` with ``recipe`` (None: the defaults; its
    name ``recipe_name`` is recorded; seeded by ``seed``; with ``resume`` the state after every epoch is saved in
    ``out`` and a rerun continues from it), measure test loss and accuracy on ``test`` and save ``out/model.pt`` (a
    safe checkpoint; ``metadata`` plus the epochs, the test accuracy and the seed) into the folder ``out`` (created if
    missing). ``note`` is told, before the training, when ``test`` holds the training data (:func:`same_data`: a
    folder without separate splits). A bad recipe option fails before anything is written."""
    from robustest.evaluate import loss_and_accuracy
    from robustest.models.checkpoints import save_checkpoint

    options = as_recipe(recipe).check(epochs)  # what results.json records; a bad option fails before any work
    same = same_data(train, test)
    if same and note is not None:
        note("the test data is the training data (no separate test split): the reported test accuracy is measured "
             "on the training data")
    out = check_writable(out)
    history = fit(model, train, epochs, batch_size, options, seed=seed, device=device, progress=progress,
                  state_dir=out if resume else None, resume=resume)
    t1 = time.perf_counter()
    test_loss, test_acc = loss_and_accuracy(model, test)
    t_eval = time.perf_counter() - t1
    save_checkpoint(out / "model.pt", model, metadata={**(metadata or {}), "epochs": epochs,
                                                        "test_accuracy": test_acc, "seed": seed})
    recipe = {"name": recipe_name, "epochs": epochs, "batch_size": batch_size, **options.to_dict()}
    return TrainRun(model, history, test_loss, test_acc, num_samples(train), num_samples(test),
                    same, recipe, {"train_s": history.seconds, "eval_s": t_eval})
