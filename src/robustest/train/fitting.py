"""Supervised training: :func:`fit` trains a classifier with Adam or SGD, optional LR schedule and validation,
seeded; the recipe options (momentum, warm-up, label smoothing, mixed precision, compile, crop-flip, per-epoch
resume) come from :mod:`robustest.train.recipes`; :class:`robustest.train.engine.TrainData` gives the batches of
one epoch from any data-like object (also under torchrun); :func:`channel_stats` the per-channel statistics a
Normalize layer takes.
Validation during :func:`fit` is measured with :func:`robustest.evaluate.loss_and_accuracy`; the epochs run
through :func:`robustest.train.engine.run_epochs` (:class:`_Fit` is fit's :class:`~robustest.train.engine.EpochLoop`);
each batch's loss is the ``cross-entropy`` objective's of :mod:`robustest.train.objectives`, looked up in the
registry when fit starts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from robustest.core import distributed
from robustest.core.batching import DataLike, iter_batches
from robustest.core.devices import channels_last_wanted, resolve_device
from robustest.core.distributed import Shard
from robustest.core.errors import ConfigError, DataError
from robustest.core.modelcall import set_mode
from robustest.core.seeding import make_generator, seed_everything
from robustest.evaluate import loss_and_accuracy
from robustest.train import objectives
from robustest.train.early_stopping import KEEP
from robustest.train.engine import Batch, EpochLoop, TrainData, run_epochs
from robustest.train.objectives.base import Objective, StepContext, StepOutput
from robustest.train.recipes import (
    Recipe,
    as_recipe,
    check_device,
    compile_error,
    compile_model,
    crop_flip,
    grad_scaler,
    make_optimizer,
)
from robustest.train.schedules import make_schedule
from robustest.train.state import StateFile, check_state_dir, in_state_dir, restore_rng, rng_state

__all__ = ["EpochStats", "History", "channel_stats", "fit"]


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

    def __repr__(self) -> str:
        from robustest.core.reprs import one_line

        last = self.epochs[-1] if self.epochs else None
        return one_line(self, epochs=len(self.epochs), loss=last.loss if last else None,
                        accuracy=last.accuracy if last else None, val_accuracy=last.val_accuracy if last else None,
                        best_epoch=self.best_epoch, seconds=self.seconds)


def channel_stats(data: DataLike, batch_size: int = 1024) -> tuple[list[float], list[float]]:
    """Per-channel mean and standard deviation (floored at 1e-3) of the images of ``data``, streamed batch by
    batch in float64 (the values a zoo model's Normalize layer takes)."""
    total = sq = None
    count = 0
    for xb, _ in iter_batches(data, batch_size):
        xb = xb.double()
        s1, s2 = xb.sum(dim=(0, 2, 3)), (xb * xb).sum(dim=(0, 2, 3))
        total, sq = (s1, s2) if total is None else (total + s1, sq + s2)
        count += xb.shape[0] * xb.shape[2] * xb.shape[3]
    if total is None or count < 2:
        raise DataError("cannot compute channel statistics of an empty data set")
    mean = total / count
    var = (sq - count * mean * mean) / (count - 1)
    return mean.tolist(), var.clamp_min(0).sqrt().clamp_min(1e-3).tolist()


@dataclass
class _Fit(EpochLoop):
    """One fit call's working state and its epoch hooks (:class:`~robustest.train.engine.EpochLoop`): what trains
    (the model, the module the steps run through: compiled and/or DDP-wrapped), the batches, the optimiser,
    schedule, scaler and augmentation generator, the settings a resume file must match (also the objective's
    ``ctx.settings``), the objective that gives each batch's loss, the history and the best epoch so far, the
    validation data, the resume file and the caller's callback; the running epoch's tallies."""

    model: nn.Module
    step_model: nn.Module
    source: TrainData
    opts: Recipe
    dev: torch.device
    ddp: bool
    num_classes: int
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR | None
    scaler: torch.amp.GradScaler | None
    aug_gen: torch.Generator | None
    settings: dict[str, Any]
    objective: Objective
    history: History = field(default_factory=History)
    best_acc: float = -1.0
    best_state: dict[str, torch.Tensor] | None = None
    seconds_before: float = 0.0
    val: DataLike | None = None
    val_batch: int = 256
    keep: str = "last"
    state: StateFile | None = None
    on_epoch_end: Any = None
    t_start: float = 0.0
    first_step: bool = True  # torch.compile compiles at the run's first step
    total_loss: float = 0.0
    correct: int = 0
    n: int = 0

    def begin_epoch(self, epoch: int) -> None:
        set_mode(self.model, True)
        self.total_loss, self.correct, self.n = 0.0, 0, 0

    def batches(self, epoch: int) -> Iterable[Batch]:
        return self.source.indexed_epoch(epoch, self.num_classes)

    def forward(self, epoch: int, i: int, batch: Batch) -> tuple[torch.Tensor, tuple[StepOutput, torch.Tensor]]:
        """The batch on the device (crop-flipped with ``augment``) through the objective's step (its settings:
        fit's, ``label_smoothing`` and ``amp`` among them; its generator: the crop-flip one) -> (the loss, (the
        step's output, labels on the device))."""
        _, xb, yb = batch
        xb, yb = xb.to(self.dev, non_blocking=True), yb.to(self.dev, non_blocking=True)
        if self.aug_gen is not None:
            xb = crop_flip(xb, generator=self.aug_gen)
        with self._compile_errors():
            out = self.objective.step(self.step_model, xb, yb, self.aug_gen, StepContext(self.settings))
        return out.loss, (out, yb)

    def diverged(self, epoch: int, i: int, loss: torch.Tensor, aux: Any) -> str:
        return (f"training diverged at epoch {epoch}: the loss is {float(loss.detach())}; lower the learning rate "
                f"(lr={self.opts.lr:g}) or check the data for NaN")

    def update(self, epoch: int, i: int, batch: Batch, loss: torch.Tensor, aux: Any) -> None:
        """The optimiser step (through the GradScaler with fp16; the loss weighted by the rank's share under DDP),
        the schedule's step and the epoch's tallies."""
        out, yb = aux
        logits = out.logits
        with self._compile_errors():
            self.opt.zero_grad(set_to_none=True)
            step_loss = loss * self.source.batch_weight if self.ddp else loss
            if self.scaler is not None:
                self.scaler.scale(step_loss).backward()
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                step_loss.backward()
                self.opt.step()
        if out.restore is not None:  # what the objective asked to undo after the step (AWP's weight perturbation)
            out.restore()
        self.first_step = False
        if self.sched is not None:
            self.sched.step()
        self.total_loss += float(loss.detach()) * len(yb)
        self.correct += int((logits.detach().argmax(1) == yb).sum())
        self.n += len(yb)

    @contextmanager
    def _compile_errors(self) -> Iterator[None]:
        """torch.compile's failure at the run's first step becomes a one-line ConfigError."""
        try:
            yield
        except Exception as exc:
            err = compile_error(exc) if (self.opts.compile and self.first_step) else None
            if err is not None:
                raise err from exc
            raise

    def summary(self, epoch: int) -> EpochStats:
        """The epoch's loss, accuracy and last learning rate (over every rank's samples under DDP)."""
        total_loss, correct, n = self.total_loss, self.correct, self.n
        if self.ddp:
            total_loss, correct, n = distributed.all_reduce_sum(torch.tensor(
                [total_loss, float(correct), float(n)], dtype=torch.float64, device=self.dev)).tolist()
        n = max(n, 1)
        return EpochStats(epoch=epoch, loss=total_loss / n, accuracy=correct / n,
                          lr=self.opt.param_groups[0]["lr"], seconds=0.0)

    def validate(self, epoch: int, record: EpochStats) -> None:
        if self.val is not None:
            _validate(self, record, self.val, self.val_batch, self.keep == "best")

    def record(self, epoch: int, record: EpochStats, seconds: float) -> None:
        record.seconds = seconds
        self.history.epochs.append(record)

    def save(self, epoch: int) -> None:
        if self.state is not None:
            _save_fit_state(self, epoch, self.seconds_before + time.perf_counter() - self.t_start, self.state)

    def after_epoch(self, epoch: int, record: EpochStats) -> None:
        if self.on_epoch_end is not None:  # e.g. keep the last epoch's weights when keep="best"
            self.on_epoch_end(epoch, self.model, record)


def fit(
    model: nn.Module,
    train: DataLike,
    epochs: int,
    batch_size: int = 64,
    recipe: Recipe | None = None,
    *,
    val: DataLike | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = True,
    keep: str = "last",
    on_epoch_end: Any = None,
    state_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    ddp: bool | None = None,
) -> History:
    """Train ``model`` in place on ``train`` ((x, y) pair, Dataset or DataLoader) for ``epochs`` epochs.

    A DataLoader is iterated anew every epoch (its augmentations and sampler apply); in-memory data is
    shuffled by a seeded permutation (:class:`TrainData`). Shuffling, dropout and initial randomness come
    from ``seed``. With ``val`` given, each epoch records validation loss/accuracy, and ``keep="best"``
    restores the weights of the epoch with the best validation accuracy (the last epoch's figures stay in the
    history; ``keep="last"``, the default, keeps the last epoch's). The model ends in eval mode.
    ``on_epoch_end(epoch, model, stats)``, when given, is called after every epoch (model in train mode).

    ``recipe`` (:class:`robustest.train.recipes.Recipe`; None: its defaults, Adam 1e-3 at a constant rate, which
    leave training as it always was): ``optimizer="sgd"`` takes ``momentum`` (default 0.9) and ``nesterov``
    (default True); ``schedule`` "cosine", "cyclic" or "step" (x0.1 at each of ``milestones``, epochs; default 50 %
    and 75 % of training), after ``warmup_epochs`` of linear warm-up; ``label_smoothing`` of the cross-entropy;
    ``decay_norm_bias=False`` keeps weight decay off normalisation layers and biases; ``amp`` "bf16" (CUDA or
    CPU autocast) or "fp16" (CUDA autocast + GradScaler); ``compile=True`` trains through ``torch.compile``;
    ``augment="crop-flip"`` pads each training image by 4, crops it back at a random offset and flips it half
    the time (batched, seeded by ``seed``; refused for a DataLoader, whose own transforms apply).
    ``state_dir``: after every epoch the model, optimiser, schedule and random states are saved atomically to
    ``state_dir/train_state.pt``; a later call with the same settings and ``resume=True`` continues after the
    last saved epoch (bit-exact on the in-memory path; a state there is never overwritten without ``resume``).
    ``ddp``: under torchrun with several ranks (None, the default, or True) the model trains with
    DistributedDataParallel, each rank on its part of every global batch (see :class:`TrainData`);
    ``ddp=False`` lets every rank train on all the data by itself, identically (for small fine-tuning sets
    whose results must equal one process's). Every option is checked before any work. Returns the
    :class:`History`.
    """
    keep = _check_fit_args(epochs, batch_size, keep, val)
    check_state_dir("fit", state_dir, resume)
    opts = as_recipe(recipe).check(epochs)
    if opts.augment is not None and isinstance(train, DataLoader):
        raise ConfigError(f"augment={opts.augment!r} applies to in-memory data and Datasets; a DataLoader's own "
                          "transforms apply: add the augmentation to its dataset's transform instead")
    dev = resolve_device(model, device)
    check_device(opts, dev)
    run = _setup(model, train, opts, dev, epochs=epochs, batch_size=batch_size, seed=seed, ddp=ddp, keep=keep,
                 val=val)
    start = 1
    run.state = in_state_dir("fit", state_dir, resume, run.settings, fix="delete it to start again")
    if run.state is not None:
        if run.state.path.is_file():
            start = _resume(run, run.state.load())
        distributed.barrier()  # every rank has read the state before rank 0 writes the next one
    run.on_epoch_end = on_epoch_end
    run.t_start = time.perf_counter()
    run_epochs(run, range(start, epochs + 1), ddp=run.ddp, progress=progress, desc="train")
    if keep == "best" and run.best_state is not None:
        model.load_state_dict(run.best_state)
    set_mode(model, False)
    run.history.seconds = run.seconds_before + time.perf_counter() - run.t_start
    return run.history


def _check_fit_args(epochs: Any, batch_size: int, keep: Any, val: DataLike | None) -> str:
    """The checks of fit's own arguments (the recipe's are :meth:`Recipe.check`'s); returns ``keep``."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ConfigError(f"epochs must be >= 0, got {epochs}")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    k = str(keep).lower()
    if k not in KEEP:
        raise ConfigError(f"keep must be 'best' (the epoch of the best validation accuracy) or 'last', got {keep!r}")
    if k == "best" and val is None:
        raise ConfigError("keep='best' picks the epoch by validation accuracy: pass val= (held-out labelled data) "
                          "or keep='last'")
    return k


def _setup(model: nn.Module, train: DataLike, opts: Recipe, dev: torch.device, *, epochs: int,
           batch_size: int, seed: int, ddp: bool | None, keep: str, val: DataLike | None) -> _Fit:
    """Move the model to ``dev``, seed, and build the batches, optimiser, schedule, scaler, augmentation
    generator and the module the steps run through (compiled, DDP-wrapped under torchrun); the objective is the
    registry's ``cross-entropy``."""
    model.to(dev)
    seed_everything(seed)
    shard = Shard.current() if ddp is not False else Shard()
    use_ddp = shard.world_size > 1
    source = TrainData(train, batch_size, seed, shard=shard)
    num_classes = source.check(model, dev)
    opt = make_optimizer(model, opts)
    sched = make_schedule(opt, opts, epochs, source.steps_per_epoch)
    scaler = grad_scaler(opts.amp, dev)
    aug_gen = make_generator((seed * 1_000_003 + 7_919) % 2**63) if opts.augment else None
    channels_last_wanted(model, dev)  # a conv net on CUDA goes channels_last now, before DDP lays out its buckets
    step_model = compile_model(model) if opts.compile else model
    if use_ddp:  # gradients averaged over the ranks; rank 0's weights and buffers broadcast at the start
        from torch.nn.parallel import DistributedDataParallel

        step_model = DistributedDataParallel(step_model, device_ids=[dev.index] if dev.type == "cuda" else None)
    settings = {"epochs": epochs, "batch_size": batch_size, "seed": seed, "n": source.n,
                "keep": keep, "val": val is not None, **opts.to_dict(),
                # DDP training depends on the number of ranks (each rank's share of a batch)
                **({"world_size": shard.world_size} if use_ddp else {})}
    return _Fit(model, step_model, source, opts, dev, use_ddp, num_classes, opt, sched, scaler, aug_gen, settings,
                objectives.get("cross-entropy"), val=val, val_batch=max(256, batch_size), keep=keep)


def _validate(run: _Fit, stats: EpochStats, val: DataLike, batch_size: int, keep_best: bool) -> None:
    """The epoch's validation loss and accuracy into ``stats``; with ``keep_best``, a copy of the weights of
    the best epoch so far."""
    stats.val_loss, stats.val_accuracy = loss_and_accuracy(run.model, val, batch_size=batch_size)
    if keep_best and stats.val_accuracy > run.best_acc:
        run.best_acc = stats.val_accuracy
        run.best_state = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
        run.history.best_epoch = stats.epoch


def _resume(run: _Fit, st: dict[str, Any]) -> int:
    """Load a saved training state (:meth:`StateFile.load`) into the run; returns the epoch to continue with."""
    run.model.load_state_dict(st["model"])
    run.opt.load_state_dict(st["optimizer"])
    if run.sched is not None:
        run.sched.load_state_dict(st["schedule"])
    if run.scaler is not None and st.get("scaler"):
        run.scaler.load_state_dict(st["scaler"])
    restore_rng(st["rng"], run.dev, {"data": run.source.gen, "augment": run.aug_gen})
    run.history.epochs = [EpochStats(**e) for e in st["history"]]
    best = st["best"]
    run.history.best_epoch = best["epoch"]
    run.best_acc, run.best_state = float(best["score"]), best.get("model")
    run.seconds_before = float(st["seconds"])
    return int(st["epoch"]) + 1


def _save_fit_state(run: _Fit, epoch: int, seconds: float, state: StateFile) -> None:
    """Write the state after ``epoch`` (:mod:`robustest.train.state`): weights, optimiser, schedule, scaler, every
    generator, the history and the best epoch so far."""
    state.save(epoch, model=run.model, optimizer=run.opt, schedule=run.sched, scaler=run.scaler,
               rng=rng_state(run.dev, {"data": run.source.gen, "augment": run.aug_gen}),
               history=[asdict(e) for e in run.history.epochs],
               best={"epoch": run.history.best_epoch, "score": run.best_acc, "model": run.best_state},
               seconds=seconds)
