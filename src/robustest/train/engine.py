"""The one epoch engine of training: :func:`robustest.train.fit`, :func:`robustest.train.harden` and
:func:`robustest.weakrobust.enhance` run their epochs through :func:`run_epochs`, and read their batches from
:class:`TrainData` where the data may be any source.

A run says *what* it does through the hooks of an :class:`EpochLoop`; the engine fixes *in which order*::

    for epoch in epochs:                               # first..last; a resumed run starts after its saved epoch
        if loop.stopped(): break                        # e.g. harden's catastrophic-overfitting guard fired
        loop.begin_epoch(epoch)                         # per-epoch seeds and generators, train mode, tallies
        for i, batch in enumerate(loop.batches(epoch)): # (idx, x, y) in the order the run draws
            loss, aux = loop.forward(epoch, i, batch)   # the batch's loss (a scalar tensor) and what update needs
            check_finite(loss, ...)                     # TrainingDiverged with loop.diverged(...)'s message
            loop.update(epoch, i, batch, loss, aux)     # backward, optimiser and schedule steps, the tallies
        record = loop.summary(epoch)                    # the epoch's figures (over every rank under DDP)
        loop.validate(epoch, record)                    # robust validation, best-checkpoint keeping
        loop.record(epoch, record, seconds)             # the history
        loop.save(epoch)                                # the resume state (atomically)
        loop.after_epoch(epoch, record)                 # the caller's on_epoch_end

The engine draws no random number itself: every shuffle, random start, augmentation and dropout draw is the
run's (fit carries one generator across epochs, harden derives fresh seeds per epoch, enhance keeps its own
streams), so a run keeps its draws, in their order, whatever engine runs it. Resuming is the run's: it loads its
state before :func:`run_epochs` and passes the epochs still to train; :meth:`EpochLoop.save` writes the next, every
run in the one format of :mod:`robustest.train.state`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from robustest.core import distributed
from robustest.core.batching import DataLike, as_tensors, converts_batches, labels_of, split_batch
from robustest.core.distributed import Shard
from robustest.core.errors import ConfigError, DataError, TrainingDiverged
from robustest.core.inputs import check_images, check_labels
from robustest.core.modelcall import eval_mode, forward
from robustest.core.progress import progress as progress_bar
from robustest.core.seeding import make_generator

__all__ = ["Batch", "EpochLoop", "TrainData", "check_finite", "run_epochs"]

#: one batch: (positions in the data set, int64 [B], or None from a DataLoader; images B x C x H x W; labels [B])
Batch = tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]


class EpochLoop:
    """The hooks :func:`run_epochs` calls, in the order its module docstring shows. A run subclasses it and
    implements :meth:`batches`, :meth:`forward`, :meth:`diverged`, :meth:`update`, :meth:`summary` and
    :meth:`record`; the other hooks do nothing unless overridden."""

    def stopped(self) -> bool:
        """True to end training before the next epoch."""
        return False

    def begin_epoch(self, epoch: int) -> None:
        """Prepare epoch ``epoch`` (1-based): its seeds and generators, the model's mode, zeroed tallies."""

    def batches(self, epoch: int) -> Iterable[Batch]:
        """The epoch's batches (idx, x, y), in the run's order."""
        raise NotImplementedError

    def forward(self, epoch: int, i: int, batch: Batch) -> tuple[torch.Tensor, Any]:
        """Step ``i`` (0-based) up to its loss: (loss, a scalar tensor; whatever :meth:`update` needs)."""
        raise NotImplementedError

    def diverged(self, epoch: int, i: int, loss: torch.Tensor, aux: Any) -> str:
        """The one-line message of the TrainingDiverged raised when step ``i``'s loss is not finite."""
        raise NotImplementedError

    def update(self, epoch: int, i: int, batch: Batch, loss: torch.Tensor, aux: Any) -> None:
        """Step ``i`` after its finite loss: backward, the optimiser's (and schedule's) step, the tallies."""
        raise NotImplementedError

    def summary(self, epoch: int) -> Any:
        """The epoch's record (its figures; under DDP over every rank's samples)."""
        raise NotImplementedError

    def validate(self, epoch: int, record: Any) -> None:
        """Validation figures into ``record``; keep the best epoch's weights."""

    def record(self, epoch: int, record: Any, seconds: float) -> None:
        """Add the epoch's ``record`` (it took ``seconds``, validation included) to the history."""
        raise NotImplementedError

    def save(self, epoch: int) -> None:
        """Write the state a resumed run continues from after ``epoch``."""

    def after_epoch(self, epoch: int, record: Any) -> None:
        """Whatever the caller asked for after every epoch (its ``on_epoch_end``)."""


def check_finite(loss: torch.Tensor, message: Callable[[], str], ddp: bool = False) -> None:
    """Raise :class:`TrainingDiverged` with ``message()`` when the scalar ``loss`` is not finite; with ``ddp``
    when it is not finite on any rank (every rank stops together, not only the one that saw it)."""
    bad = ~torch.isfinite(loss.detach())
    if ddp:
        bad = distributed.all_reduce_sum(bad.float().reshape(1)) > 0
    if bool(bad):
        raise TrainingDiverged(message())


def run_epochs(loop: EpochLoop, epochs: Iterable[int], *, ddp: bool = False, progress: bool = False,
               desc: str | None = None) -> None:
    """Train ``loop`` through ``epochs`` (e.g. ``range(start, last + 1)``): per epoch its batches, each one's
    loss checked finite (on every rank together with ``ddp``) before its update, then the summary, validation,
    history, resume state and the caller's callback. ``progress``: a progress bar over the epochs (``desc``)."""
    for epoch in progress_bar(epochs, enabled=progress, desc=desc, unit="epoch"):
        if loop.stopped():
            break
        t0 = time.perf_counter()
        loop.begin_epoch(epoch)
        for i, batch in enumerate(loop.batches(epoch)):
            loss, aux = loop.forward(epoch, i, batch)
            check_finite(loss, lambda: loop.diverged(epoch, i, loss, aux), ddp=ddp)  # noqa: B023 - called now
            loop.update(epoch, i, batch, loss, aux)
        record = loop.summary(epoch)
        loop.validate(epoch, record)
        loop.record(epoch, record, time.perf_counter() - t0)
        loop.save(epoch)
        loop.after_epoch(epoch, record)


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

    def gather(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at positions ``idx`` (int64 [B]) of in-memory data: (images B x C x H x W, labels [B])."""
        if self.ds is not None:
            x, y = self.ds.get_batch(idx)
            return check_images(x, "training images"), y
        assert self.x is not None and self.y is not None
        return self.x[idx], self.y[idx]

    def first_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.loader is None:
            return self.gather(torch.arange(min(self.n, 1)))
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
                yield (idx, *self.gather(idx))
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
                      persistent_workers=loader.persistent_workers if loader.num_workers > 0 else False,
                      prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
                      timeout=loader.timeout)
