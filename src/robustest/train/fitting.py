"""Supervised training: :func:`fit` trains a classifier with Adam or SGD, optional LR schedule and validation,
seeded; the recipe options (momentum, warm-up, label smoothing, mixed precision, compile, crop-flip, per-epoch
resume) come from :mod:`robustest.train.recipes`. :class:`TrainData` gives the batches of one epoch from any
data-like object (also under torchrun); :func:`channel_stats` the per-channel statistics a Normalize layer takes.
Validation during :func:`fit` is measured with :func:`robustest.evaluate.loss_and_accuracy`.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from robustest.core import distributed
from robustest.core.amp import autocast
from robustest.core.atomic import atomic_save
from robustest.core.batching import DataLike, as_tensors, converts_batches, iter_batches, labels_of, split_batch
from robustest.core.devices import channels_last_wanted, resolve_device
from robustest.core.distributed import Shard
from robustest.core.errors import ConfigError, DataError, TrainingDiverged
from robustest.core.inputs import check_images, check_labels
from robustest.core.modelcall import eval_mode, forward, set_mode
from robustest.core.progress import progress as progress_bar
from robustest.core.seeding import make_generator, seed_everything
from robustest.evaluate import loss_and_accuracy
from robustest.train.recipes import (
    TrainOptions,
    check_device,
    check_options,
    compile_error,
    compile_model,
    crop_flip,
    grad_scaler,
    make_optimizer,
)
from robustest.train.schedules import make_schedule

__all__ = ["FIT_STATE_FORMAT", "EpochStats", "History", "TrainData", "channel_stats", "fit"]

FIT_STATE_FORMAT = "robustest-fit-state-1"


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


class TrainData:
    """The batches of one training epoch from any data-like object.

    Tensors, TensorDatasets and robustest ImageDatasets take the in-memory path: a seeded permutation per
    epoch, each batch gathered by index (an ImageDataset converts only that batch from its compact storage).
    A DataLoader is iterated as it is, every epoch, so its transforms (random augmentation) and sampler
    apply; a sampler with ``set_epoch`` (DistributedSampler) is told the epoch. Any other Dataset is read
    through a shuffling DataLoader seeded with ``seed`` (workers from its ``num_workers`` attribute).

    With a ``shard`` of several ranks (DistributedDataParallel under torchrun): on the in-memory path every
    rank draws the same permutation and takes its contiguous part of each global batch of ``batch_size``
    (``batch_weight`` then rescales the rank's mean loss so that DDP's gradient average equals the global
    batch's mean gradient; a final batch with fewer samples than ranks is skipped); a Dataset or DataLoader
    is read through a ``DistributedSampler`` (seeded, ``set_epoch`` every epoch), a DataLoader's batch size
    being per rank.
    """

    def __init__(self, data: DataLike, batch_size: int, seed: int, shard: Shard | None = None) -> None:
        self.batch_size = batch_size
        self.gen = make_generator(seed)
        self.shard = shard or Shard()
        self.batch_weight = 1.0
        self.loader: DataLoader | None = None
        self.x = self.y = None
        self.ds = None
        world, rank = self.shard.world_size, self.shard.rank
        if isinstance(data, DataLoader):
            self.loader = data if world == 1 else _distributed_loader(data, self.shard, seed)
        elif converts_batches(data):
            self.ds = data
            self.y = labels_of(data)
        elif isinstance(data, Dataset) and not isinstance(data, TensorDataset):
            workers = int(getattr(data, "num_workers", 0) or 0)
            if world == 1:
                self.loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=self.gen,
                                         num_workers=workers)
            else:
                from torch.utils.data.distributed import DistributedSampler

                sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=seed)
                self.loader = DataLoader(data, batch_size=-(-batch_size // world), sampler=sampler,
                                         num_workers=workers)
        else:
            self.x, self.y = as_tensors(data)
            if self.y is None:
                raise ConfigError("training data needs labels: pass (x, y) or a labelled Dataset")
            check_images(self.x, "training images")
        if self.loader is None:
            assert self.y is not None
            self.n = int(self.y.shape[0])
            check_labels(self.y, self.n, name="training labels")
            full, tail = divmod(self.n, batch_size)
            self.steps_per_epoch = full + (1 if tail >= world else 0)
        else:
            self.n = len(self.loader.dataset)  # type: ignore[arg-type]
            try:
                self.steps_per_epoch = len(self.loader)
            except TypeError:  # an IterableDataset without a length
                self.steps_per_epoch = math.ceil(self.n / batch_size)
        if self.n == 0:
            raise DataError("the training data is empty: check the split, the path and --limit")

    def _gather(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ds is not None:
            x, y = self.ds.get_batch(idx)
            return check_images(x, "training images"), y
        assert self.x is not None and self.y is not None
        return self.x[idx], self.y[idx]

    def first_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.loader is None:
            return self._gather(torch.arange(min(self.n, 1)))
        for batch in self.loader:
            x, y = split_batch(batch)
            if y is None:
                raise ConfigError("training data needs labels: the DataLoader yields images only")
            return x, y
        raise DataError("the training data is empty: the DataLoader yields no batches")

    def check(self, model: nn.Module, dev: torch.device) -> int:
        """Labels must index the model's outputs; returns the model's number of classes."""
        x, _ = self.first_batch()
        with torch.no_grad(), eval_mode(model):
            num_classes = forward(model, check_images(x[:1], "training images").to(dev)).shape[-1]
        if self.y is not None:
            check_labels(self.y, self.n, num_classes, name="training labels")
        return int(num_classes)

    def epoch(self, epoch: int, num_classes: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The (x, y) batches of epoch ``epoch`` (1-based)."""
        for _, x, y in self.indexed_epoch(epoch, num_classes):
            yield x, y

    def indexed_epoch(self, epoch: int, num_classes: int
                      ) -> Iterator[tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]]:
        """(positions, x, y) batches: positions in the data set on the in-memory path, None from a DataLoader
        (whose items may be augmented views rather than stored samples)."""
        if self.loader is None:
            perm = torch.randperm(self.n, generator=self.gen)
            world = self.shard.world_size
            for s in range(0, self.n, self.batch_size):
                idx = perm[s:s + self.batch_size]
                if world > 1:
                    if len(idx) < world:  # every rank needs samples for DDP's gradient exchange
                        continue
                    full = len(idx)
                    idx = idx.tensor_split(world)[self.shard.rank]
                    self.batch_weight = len(idx) * world / full
                yield (idx, *self._gather(idx))
            return
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        for batch in self.loader:
            x, y = split_batch(batch)
            if y is None:
                raise ConfigError("training data needs labels: the DataLoader yields images only")
            x = check_images(x, "training images")
            yield None, x, check_labels(torch.as_tensor(y), len(x), num_classes, name="training labels")


def _distributed_loader(loader: DataLoader, shard: Shard, seed: int) -> DataLoader:
    """``loader`` re-read through a DistributedSampler for this rank (same dataset, batch size per rank,
    collate function, workers; shuffled when the loader shuffles)."""
    from torch.utils.data import RandomSampler
    from torch.utils.data.distributed import DistributedSampler

    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        raise ConfigError("an IterableDataset cannot be split across torchrun's ranks by robustest: shard the "
                          "stream yourself per rank, or train in one process")
    if loader.batch_size is None:
        raise ConfigError("under torchrun a DataLoader with its own batch_sampler cannot be split across ranks: "
                          "give it a batch_size (per rank) instead")
    sampler = loader.sampler if isinstance(loader.sampler, DistributedSampler) else DistributedSampler(
        loader.dataset, num_replicas=shard.world_size, rank=shard.rank,
        shuffle=isinstance(loader.sampler, RandomSampler), seed=seed)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                      num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                      drop_last=loader.drop_last, worker_init_fn=loader.worker_init_fn,
                      persistent_workers=loader.persistent_workers if loader.num_workers > 0 else False)


@dataclass
class _Fit:
    """One fit call's working state: what trains (the model, the module the steps run through: compiled and/or
    DDP-wrapped), the batches, the optimiser, schedule, scaler and augmentation generator, the history and the best
    epoch so far, and the settings a resume file must match."""

    model: nn.Module
    step_model: nn.Module
    source: TrainData
    opts: TrainOptions
    dev: torch.device
    ddp: bool
    num_classes: int
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR | None
    scaler: torch.amp.GradScaler | None
    aug_gen: torch.Generator | None
    settings: str
    history: History = field(default_factory=History)
    best_acc: float = -1.0
    best_state: dict[str, torch.Tensor] | None = None
    seconds_before: float = 0.0


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
    *,
    momentum: float | None = None,
    nesterov: bool | None = None,
    warmup_epochs: float = 0.0,
    milestones: Sequence[float] | None = None,
    label_smoothing: float = 0.0,
    decay_norm_bias: bool = True,
    amp: str | None = None,
    compile: bool = False,
    augment: str | None = None,
    resume_file: str | os.PathLike[str] | None = None,
    ddp: bool | None = None,
) -> History:
    """Train ``model`` in place on ``train`` ((x, y) pair, Dataset or DataLoader) for ``epochs`` epochs.

    A DataLoader is iterated anew every epoch (its augmentations and sampler apply); in-memory data is
    shuffled by a seeded permutation (:class:`TrainData`). Shuffling, dropout and initial randomness come
    from ``seed``. With ``val`` given, each epoch records
    validation loss/accuracy, and ``restore_best=True`` restores the weights of the epoch with the best
    validation accuracy (the last epoch's figures stay in the history). The model ends in eval mode.
    ``on_epoch_end(epoch, model, stats)``, when given, is called after every epoch (model in train mode).

    Recipe options (keyword only; their defaults leave training as it always was, see
    :mod:`robustest.train.recipes`): ``optimizer="sgd"`` takes ``momentum`` (default 0.9) and ``nesterov``
    (default True); ``schedule`` "cosine" or "step" (x0.1 at each of ``milestones``, epochs; default 50 % and
    75 % of training), after ``warmup_epochs`` of linear warm-up; ``label_smoothing`` of the cross-entropy;
    ``decay_norm_bias=False`` keeps weight decay off normalisation layers and biases; ``amp`` "bf16" (CUDA or
    CPU autocast) or "fp16" (CUDA autocast + GradScaler); ``compile=True`` trains through ``torch.compile``;
    ``augment="crop-flip"`` pads each training image by 4, crops it back at a random offset and flips it half
    the time (batched, seeded by ``seed``; refused for a DataLoader, whose own transforms apply).
    ``resume_file``: after every epoch the model, optimiser, schedule and random states are saved there
    atomically; a later call with the same settings continues after the last saved epoch (bit-exact on the
    in-memory path). ``ddp``: under torchrun with several ranks (None, the default, or True) the model trains
    with DistributedDataParallel, each rank on its part of every global batch (see :class:`TrainData`);
    ``ddp=False`` lets every rank train on all the data by itself, identically (for small fine-tuning sets
    whose results must equal one process's). Every option is checked before any work. Returns the
    :class:`History`.
    """
    _check_fit_args(epochs, batch_size, lr, weight_decay, restore_best, val)
    opts = check_options(epochs, optimizer=optimizer, lr=lr, weight_decay=weight_decay, momentum=momentum,
                         nesterov=nesterov, schedule=schedule, warmup_epochs=warmup_epochs, milestones=milestones,
                         label_smoothing=label_smoothing, decay_norm_bias=decay_norm_bias, amp=amp,
                         compile=compile, augment=augment)
    if opts.augment is not None and isinstance(train, DataLoader):
        raise ConfigError(f"augment={opts.augment!r} applies to in-memory data and Datasets; a DataLoader's own "
                          "transforms apply: add the augmentation to its dataset's transform instead")
    dev = resolve_device(model, device)
    check_device(opts, dev)
    state_path = Path(resume_file) if resume_file is not None else None
    if state_path is not None and state_path.exists() and not state_path.is_file():
        raise ConfigError(f"resume_file {str(state_path)!r} exists and is not a file: choose another path")
    run = _setup(model, train, opts, dev, epochs=epochs, batch_size=batch_size, seed=seed, ddp=ddp,
                 restore_best=restore_best, val=val)
    start = 1
    if state_path is not None and state_path.is_file():
        start = _resume(run, _load_fit_state(state_path, run.settings))
    if state_path is not None:  # every rank has read the state before rank 0 writes the next one
        distributed.barrier()
    t_start = time.perf_counter()
    first_step = start <= epochs
    for epoch in progress_bar(range(start, epochs + 1), enabled=progress, desc="train", unit="epoch"):
        t0 = time.perf_counter()
        stats, first_step = _train_epoch(run, epoch, first_step)
        if val is not None:
            _validate(run, stats, val, max(256, batch_size), restore_best)
        stats.seconds = time.perf_counter() - t0
        run.history.epochs.append(stats)
        if state_path is not None:
            _save_fit_state(run, epoch, run.seconds_before + time.perf_counter() - t_start, state_path)
        if on_epoch_end is not None:  # e.g. keep the last epoch's weights when restore_best is used
            on_epoch_end(epoch, model, stats)
    if restore_best and run.best_state is not None:
        model.load_state_dict(run.best_state)
    set_mode(model, False)
    run.history.seconds = run.seconds_before + time.perf_counter() - t_start
    return run.history


def _check_fit_args(epochs: Any, batch_size: int, lr: float, weight_decay: float, restore_best: bool,
                    val: DataLike | None) -> None:
    """The checks of fit's own arguments (the recipe options are :func:`check_options`')."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ConfigError(f"epochs must be >= 0, got {epochs}")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if not lr > 0:
        raise ConfigError(f"lr must be positive, got {lr}")
    if restore_best and val is None:
        raise ConfigError("restore_best needs validation data (val=...)")
    for name, v in (("lr", lr), ("weight_decay", weight_decay)):
        if not math.isfinite(float(v)) or v < 0:
            raise ConfigError(f"{name} must be a finite non-negative number, got {v}")


def _setup(model: nn.Module, train: DataLike, opts: TrainOptions, dev: torch.device, *, epochs: int,
           batch_size: int, seed: int, ddp: bool | None, restore_best: bool, val: DataLike | None) -> _Fit:
    """Move the model to ``dev``, seed, and build the batches, optimiser, schedule, scaler, augmentation
    generator and the module the steps run through (compiled, DDP-wrapped under torchrun)."""
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
    settings = json.dumps({"epochs": epochs, "batch_size": batch_size, "seed": seed, "n": source.n,
                           "restore_best": restore_best, "val": val is not None, **opts.to_dict(),
                           # DDP training depends on the number of ranks (each rank's share of a batch)
                           **({"world_size": shard.world_size} if use_ddp else {})}, sort_keys=True)
    return _Fit(model, step_model, source, opts, dev, use_ddp, num_classes, opt, sched, scaler, aug_gen, settings)


def _train_epoch(run: _Fit, epoch: int, first_step: bool) -> tuple[EpochStats, bool]:
    """One epoch over the run's batches (model in train mode): its loss, accuracy and last learning rate (summed
    over every rank under DDP), and whether the next step is still the run's first (no batch came)."""
    set_mode(run.model, True)
    total_loss, correct, n = 0.0, 0, 0
    for xb, yb in run.source.epoch(epoch, run.num_classes):
        xb, yb = xb.to(run.dev, non_blocking=True), yb.to(run.dev, non_blocking=True)
        if run.aug_gen is not None:
            xb = crop_flip(xb, generator=run.aug_gen)
        loss, logits = _train_step(run, xb, yb, epoch, first_step)
        first_step = False
        if run.sched is not None:
            run.sched.step()
        total_loss += float(loss.detach()) * len(yb)
        correct += int((logits.detach().argmax(1) == yb).sum())
        n += len(yb)
    if run.ddp:  # the epoch's figures over every rank's samples
        total_loss, correct, n = distributed.all_reduce_sum(
            torch.tensor([total_loss, float(correct), float(n)], dtype=torch.float64, device=run.dev)).tolist()
    n = max(n, 1)
    return EpochStats(epoch=epoch, loss=total_loss / n, accuracy=correct / n, lr=run.opt.param_groups[0]["lr"],
                      seconds=0.0), first_step


def _train_step(run: _Fit, xb: torch.Tensor, yb: torch.Tensor, epoch: int, first_step: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimiser step on the batch xb (B x C x H x W), yb (int64 [B]); returns (loss, logits B x K). A loss
    that is not finite stops training (on every rank together); torch.compile's failure at the first step is a
    one-line ConfigError."""
    opts = run.opts
    try:
        with autocast(opts.amp, run.dev):
            logits = forward(run.step_model, xb)
            loss = (F.cross_entropy(logits, yb, label_smoothing=opts.label_smoothing)
                    if opts.label_smoothing else F.cross_entropy(logits, yb))
        bad = ~torch.isfinite(loss.detach())
        if run.ddp:  # every rank stops together, not only the one that saw it
            bad = distributed.all_reduce_sum(bad.float().reshape(1)) > 0
        if bool(bad):
            raise TrainingDiverged(f"training diverged at epoch {epoch}: the loss is {float(loss)}; lower "
                                   f"the learning rate (lr={opts.lr:g}) or check the data for NaN")
        run.opt.zero_grad(set_to_none=True)
        step_loss = loss * run.source.batch_weight if run.ddp else loss
        if run.scaler is not None:
            run.scaler.scale(step_loss).backward()
            run.scaler.step(run.opt)
            run.scaler.update()
        else:
            step_loss.backward()
            run.opt.step()
    except Exception as exc:
        err = compile_error(exc) if (opts.compile and first_step) else None
        if err is not None:
            raise err from exc
        raise
    return loss, logits


def _validate(run: _Fit, stats: EpochStats, val: DataLike, batch_size: int, restore_best: bool) -> None:
    """The epoch's validation loss and accuracy into ``stats``; with ``restore_best``, a copy of the weights of
    the best epoch so far."""
    stats.val_loss, stats.val_accuracy = loss_and_accuracy(run.model, val, batch_size=batch_size)
    if restore_best and stats.val_accuracy > run.best_acc:
        run.best_acc = stats.val_accuracy
        run.best_state = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
        run.history.best_epoch = stats.epoch


def _resume(run: _Fit, st: dict[str, Any]) -> int:
    """Load a saved training state into the run; returns the epoch to continue with."""
    run.model.load_state_dict(st["model"])
    run.opt.load_state_dict(st["optimizer"])
    if run.sched is not None:
        run.sched.load_state_dict(st["schedule"])
    if run.scaler is not None and st.get("scaler"):
        run.scaler.load_state_dict(st["scaler"])
    run.source.gen.set_state(st["gen"])
    if run.aug_gen is not None:
        run.aug_gen.set_state(st["aug_gen"])
    torch.set_rng_state(st["torch_rng"])
    if run.dev.type == "cuda" and st.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(st["cuda_rng"], run.dev)
    run.history.epochs = [EpochStats(**e) for e in st["history"]]
    run.history.best_epoch = st["best_epoch"]
    run.best_acc, run.best_state = float(st["best_acc"]), st.get("best_state")
    run.seconds_before = float(st["seconds"])
    return int(st["epoch"]) + 1


def _save_fit_state(run: _Fit, epoch: int, seconds: float, path: Path) -> None:
    """Write the state after ``epoch`` atomically: weights, optimiser, schedule, scaler, every generator, the
    history and the best epoch so far."""
    dev = run.dev
    atomic_save({"format": FIT_STATE_FORMAT, "settings": run.settings, "epoch": epoch,
                 "model": run.model.state_dict(), "optimizer": run.opt.state_dict(),
                 "schedule": run.sched.state_dict() if run.sched is not None else None,
                 "scaler": run.scaler.state_dict() if run.scaler is not None else None,
                 "gen": run.source.gen.get_state(), "aug_gen": run.aug_gen.get_state() if run.aug_gen is not None
                 else None, "torch_rng": torch.get_rng_state(),
                 "cuda_rng": torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None,
                 "history": [asdict(e) for e in run.history.epochs], "best_epoch": run.history.best_epoch,
                 "best_acc": run.best_acc, "best_state": run.best_state, "seconds": seconds}, path)


def _load_fit_state(path: Path, settings: str) -> dict[str, Any]:
    """The training state :func:`fit` saved at ``path``; a one-line ConfigError when it is not one or was
    written with other settings."""
    try:
        st = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated, foreign or unsafe file
        raise ConfigError(f"resume_file {str(path)!r} is not a training state robustest wrote: delete it or "
                          "choose another path") from exc
    if not isinstance(st, dict) or st.get("format") != FIT_STATE_FORMAT:
        raise ConfigError(f"resume_file {str(path)!r} is not a training state robustest wrote: delete it or "
                          "choose another path")
    if st.get("settings") != settings:
        try:
            old, new = json.loads(st["settings"]), json.loads(settings)
        except (TypeError, ValueError):
            old, new = {}, {}
        w_old, w_new = old.pop("world_size", 1), new.pop("world_size", 1)
        if w_old != w_new and old == new:
            raise ConfigError(f"resume_file {str(path)!r} holds training by {w_old} process(es) and this run has "
                              f"{w_new}: resume with the same number (torchrun --nproc-per-node {w_old}), or delete "
                              "it to start again")
        raise ConfigError(f"resume_file {str(path)!r} holds training with other settings (epochs, data, "
                          "recipe): resume with the same settings, or delete it to start again")
    return st
