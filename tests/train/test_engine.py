"""The training engine's data side (robustest.train.engine.TrainData): how many steps an epoch takes and which
samples each batch holds, at the boundaries of the batch size and of the ranks."""

from __future__ import annotations

import pytest
import torch

from robustest.core.distributed import Shard
from robustest.train import fit
from robustest.train.engine import TrainData


def data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(n, 1, 4, 4), torch.arange(n) % 3


@pytest.mark.parametrize("n, batch, steps", [(9, 4, 3), (8, 4, 2), (1, 4, 1), (4, 4, 1), (5, 4, 2)])
def test_steps_per_epoch_counts_the_short_last_batch(n, batch, steps):
    td = TrainData(data(n), batch, seed=0)
    batches = list(td.indexed_epoch(1, 3))
    assert td.steps_per_epoch == steps == len(batches)
    assert [len(b[0]) for b in batches] == [batch] * (n // batch) + ([n % batch] if n % batch else [])
    assert sorted(torch.cat([b[0] for b in batches]).tolist()) == list(range(n))  # every sample once


@pytest.mark.parametrize("n, steps", [(9, 2), (10, 3), (8, 2)])
def test_under_two_ranks_a_last_batch_smaller_than_the_ranks_is_skipped(n, steps):
    # batches of 4 over 2 ranks: a tail of 1 sample cannot feed both ranks, a tail of 2 can
    parts = [TrainData(data(n), 4, seed=0, shard=Shard(rank, 2)) for rank in (0, 1)]
    assert [p.steps_per_epoch for p in parts] == [steps, steps]
    got = [list(p.indexed_epoch(1, 3)) for p in parts]
    assert [len(g) for g in got] == [steps, steps]
    for b0, b1 in zip(*got):  # the two ranks split each global batch into disjoint halves
        assert set(b0[0].tolist()).isdisjoint(b1[0].tolist()) and len(b0[0]) == len(b1[0])


def test_the_same_seed_draws_the_same_order_and_another_seed_another():
    a = [b[0].tolist() for b in TrainData(data(12), 5, seed=3).indexed_epoch(1, 3)]
    b = [b[0].tolist() for b in TrainData(data(12), 5, seed=3).indexed_epoch(1, 3)]
    c = [b[0].tolist() for b in TrainData(data(12), 5, seed=4).indexed_epoch(1, 3)]
    assert a == b and a != c
    x, y = data(12)
    td = TrainData((x, y), 5, seed=3)
    for idx, xb, yb in td.indexed_epoch(1, 3):
        assert torch.equal(xb, x[idx]) and torch.equal(yb, y[idx])


class Plain(torch.utils.data.Dataset):
    """A map-style data set that is not a TensorDataset: the engine reads it through a DataLoader."""

    def __init__(self, n: int) -> None:
        self.x, self.y = data(n)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def test_a_dataset_is_read_in_batches_of_the_batch_size():
    ds = Plain(10)
    td = TrainData(ds, 4, seed=0)
    assert td.n == 10 and td.steps_per_epoch == 3 and td.batch_weight == 1.0
    batches = list(td.indexed_epoch(1, 3))
    assert [len(b[1]) for b in batches] == [4, 4, 2] and all(b[0] is None for b in batches)
    assert sorted(torch.cat([b[2] for b in batches]).tolist()) == sorted(ds.y.tolist())


def test_a_datasets_order_is_drawn_from_the_seed_not_from_torchs_global_generator():
    """The shuffling DataLoader of a plain Dataset takes the run's seeded generator: the same seed gives the same
    order whatever the global generator holds: the order of a shuffling DataLoader given that seed's generator."""
    from robustest.core.seeding import make_generator

    ds = Plain(10)
    orders = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        orders.append(torch.cat([b[2] for b in TrainData(ds, 4, seed=5).indexed_epoch(1, 3)]).tolist())
    seeded = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, generator=make_generator(5))
    assert orders[0] == orders[1] == torch.cat([y for _, y in seeded]).tolist()


def test_a_dataset_under_two_ranks_is_split_by_a_seeded_sampler_that_moves_every_epoch():
    ds = Plain(12)
    parts = [TrainData(ds, 4, seed=0, shard=Shard(rank, 2)) for rank in (0, 1)]
    assert [p.n for p in parts] == [12, 12] and [p.steps_per_epoch for p in parts] == [3, 3]  # 6 each, 2 a batch
    x = ds.x
    seen = []
    for p in parts:
        batches = list(p.indexed_epoch(1, 3))
        assert [len(b[1]) for b in batches] == [2, 2, 2]
        seen.append({int((x == xb).flatten(1).all(1).nonzero()[0]) for b in batches for xb in b[1]})
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == set(range(12))
    first, second = ([b[1] for b in parts[0].indexed_epoch(e, 3)] for e in (1, 2))
    assert not torch.equal(torch.cat(first), torch.cat(second))  # set_epoch: another order in epoch 2


def test_labels_out_of_range_name_the_training_labels():
    from robustest.core.errors import DataError

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
    td = TrainData(data(6), 4, seed=0)  # labels 0..2, the model has 2 classes
    with pytest.raises(DataError, match=r"^training labels has labels in \[0, 2\] outside \[0, 2\)"):
        td.check(model, torch.device("cpu"))
    loader = TrainData(Plain(6), 4, seed=0)
    with pytest.raises(DataError, match=r"^training labels has labels in \[0, 2\] outside \[0, 2\)"):
        list(loader.indexed_epoch(1, 2))
    x, y = data(6)
    with pytest.raises(DataError, match="^training labels has dtype torch.float32"):
        TrainData((x, y.float()), 4, seed=0)
    with pytest.raises(DataError, match="^training images contains NaN or infinite values"):
        TrainData((torch.full_like(x, float("nan")), y), 4, seed=0)


def test_in_memory_images_and_labels_of_different_lengths_are_refused():
    """Regression: 6 images with 3 labels trained on the first 3 images without a word."""
    from robustest.core.errors import DataError

    x, y = data(6)
    with pytest.raises(DataError, match=r"^x has 6 samples but y has 3: give one label per image$"):
        TrainData((x, y[:3]), 4, seed=0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    with pytest.raises(DataError, match=r"^x has 6 samples but y has 3: give one label per image$"):
        fit(model, (x, y[:3]), epochs=1, progress=False)
    assert TrainData((x, y), 4, seed=0).n == 6


def collate_pairs(items):
    """A collate function of the caller's own: it must survive the re-reading under torchrun."""
    xs, ys = zip(*items)
    return torch.stack(xs), torch.stack(ys)


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_dataloader_under_two_ranks_is_reread_through_a_distributed_sampler(shuffle):
    from torch.utils.data.distributed import DistributedSampler

    from robustest.train.engine import _distributed_loader

    ds = Plain(10)
    loader = torch.utils.data.DataLoader(ds, batch_size=3, shuffle=shuffle, collate_fn=collate_pairs,
                                         drop_last=True, worker_init_fn=print)
    out = _distributed_loader(loader, Shard(1, 2), seed=7)
    s = out.sampler
    assert isinstance(s, DistributedSampler) and (s.num_replicas, s.rank, s.shuffle, s.seed) == (2, 1, shuffle, 7)
    assert out.dataset is ds and out.batch_size == 3 and out.collate_fn is collate_pairs
    assert out.drop_last is True and out.worker_init_fn is print and out.num_workers == 0
    assert out.persistent_workers is False and out.pin_memory is False
    ranks = [list(_distributed_loader(loader, Shard(r, 2), seed=7)) for r in (0, 1)]
    assert [len(r) for r in ranks] == [1, 1]  # 5 samples per rank, batches of 3, the last dropped
    if not shuffle:  # DistributedSampler without shuffling: rank r takes samples r, r + 2, ...
        assert torch.equal(ranks[1][0][1], ds.y[[1, 3, 5]]) and torch.equal(ranks[0][0][1], ds.y[[0, 2, 4]])
    own = DistributedSampler(ds, num_replicas=2, rank=0, shuffle=False)
    given = torch.utils.data.DataLoader(ds, batch_size=2, sampler=own)
    assert _distributed_loader(given, Shard(1, 2), seed=7).sampler is own  # the caller's own sampler is kept
    td = TrainData(loader, 4, seed=7, shard=Shard(1, 2))
    assert isinstance(td.loader.sampler, DistributedSampler) and td.loader.sampler.rank == 1
    assert td.n == 10 and td.steps_per_epoch == 1
    assert TrainData(loader, 4, seed=7).loader is loader  # one process: the loader as it is
    workers = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2, pin_memory=True, persistent_workers=True,
                                          prefetch_factor=3, timeout=5.0)
    out = _distributed_loader(workers, Shard(0, 2), seed=7)  # the worker settings travel too (not iterated here)
    assert (out.num_workers, out.pin_memory, out.persistent_workers, out.prefetch_factor, out.timeout) == \
        (2, True, True, 3, 5.0)


def test_a_dataloader_that_cannot_be_split_across_ranks_is_refused():
    from robustest.core.errors import ConfigError
    from robustest.train.engine import _distributed_loader

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield torch.zeros(1, 4, 4), torch.tensor(0)

    with pytest.raises(ConfigError, match="^an IterableDataset cannot be split across torchrun's ranks"):
        _distributed_loader(torch.utils.data.DataLoader(Stream(), batch_size=2), Shard(0, 2), 0)
    by_batches = torch.utils.data.DataLoader(Plain(6), batch_sampler=[[0, 1], [2, 3]])
    with pytest.raises(ConfigError, match="^under torchrun a DataLoader with its own batch_sampler"):
        _distributed_loader(by_batches, Shard(0, 2), 0)


def test_a_loader_without_length_counts_its_steps_from_its_data_sets_size():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            for i in range(7):
                yield torch.zeros(1, 4, 4), torch.tensor(i % 2)

        def __len__(self):
            return 7

    class NoLength(torch.utils.data.DataLoader):
        def __len__(self):
            raise TypeError("no length")

    td = TrainData(NoLength(Stream(), batch_size=3), 3, seed=0)
    assert td.n == 7 and td.steps_per_epoch == 3  # ceil(7 / 3)


def test_a_dataset_passes_its_num_workers_to_the_loader():
    ds = Plain(6)
    assert TrainData(ds, 4, seed=0).loader.num_workers == 0  # no attribute: no workers
    ds.num_workers = 2
    assert TrainData(ds, 4, seed=0).loader.num_workers == 2  # the data set's own choice (not iterated here)
    ds.num_workers = 0
    assert TrainData(ds, 4, seed=0).loader.num_workers == 0
    ds.num_workers = None  # no attribute value: no workers
    assert TrainData(ds, 4, seed=0).loader.num_workers == 0
    loader = TrainData(ds, 4, seed=0).loader
    assert loader.batch_size == 4 and isinstance(loader.sampler, torch.utils.data.RandomSampler)
    two = TrainData(Plain(7), 5, seed=0, shard=Shard(0, 2)).loader
    assert two.batch_size == 3  # ceil(5 / 2) per rank


def test_empty_or_unlabelled_training_data_is_refused_with_one_line():
    from robustest.core.errors import ConfigError, DataError

    with pytest.raises(DataError, match="^the training data is empty: check the split, the path and --limit$"):
        TrainData((torch.zeros(0, 1, 4, 4), torch.zeros(0, dtype=torch.long)), 4, seed=0)
    with pytest.raises(ConfigError, match=r"^training data needs labels: pass \(x, y\) or a labelled Dataset$"):
        TrainData(torch.zeros(3, 1, 4, 4), 4, seed=0)
    images_only = torch.utils.data.DataLoader(torch.zeros(3, 1, 4, 4), batch_size=2)
    td = TrainData(images_only, 2, seed=0)
    with pytest.raises(ConfigError, match="^training data needs labels: the DataLoader yields images only$"):
        td.first_batch()
    with pytest.raises(ConfigError, match="^training data needs labels: the DataLoader yields images only$"):
        list(td.indexed_epoch(1, 2))
    empty = torch.utils.data.DataLoader(Plain(3), batch_size=2)
    empty.dataset.y = empty.dataset.y[:0]  # len() 0 after the loader was made
    with pytest.raises(DataError, match="^the training data is empty"):
        TrainData(empty, 2, seed=0)


def test_first_batch_and_check_read_one_sample_and_return_the_class_count():
    x, y = data(5)
    td = TrainData((x, y), 4, seed=0)
    xb, yb = td.first_batch()
    assert torch.equal(xb, x[:1]) and torch.equal(yb, y[:1])
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    model.train()
    assert td.check(model, torch.device("cpu")) == 3 and model.training  # eval only for the probe
    loader = TrainData(torch.utils.data.DataLoader(Plain(5), batch_size=2), 2, seed=0)
    xb, yb = loader.first_batch()
    assert xb.shape == (2, 1, 4, 4) and loader.check(model, torch.device("cpu")) == 3
    for (_, xe, ye), (xa, ya) in zip(loader.indexed_epoch(1, 3), loader.epoch(1, 3)):
        assert xe.shape == xa.shape and ye.dtype == ya.dtype == torch.long


class Recorder:
    """An EpochLoop that logs every hook call; ``losses[(epoch, i)]`` overrides a step's loss of 1.0."""

    def __init__(self, stop_after: int | None = None, losses: dict | None = None) -> None:
        self.log: list[tuple] = []
        self.stop_after, self.losses = stop_after, losses or {}

    def stopped(self):
        self.log.append(("stopped",))
        return self.stop_after is not None and sum(e[0] == "begin" for e in self.log) >= self.stop_after

    def begin_epoch(self, epoch):
        self.log.append(("begin", epoch))

    def batches(self, epoch):
        return [(None, torch.zeros(1), torch.zeros(1)), (None, torch.ones(1), torch.ones(1))]

    def forward(self, epoch, i, batch):
        self.log.append(("forward", epoch, i))
        return torch.tensor(self.losses.get((epoch, i), 1.0)), f"aux{i}"

    def diverged(self, epoch, i, loss, aux):
        return f"diverged at epoch {epoch} step {i} ({aux}, loss {loss.item()})"

    def update(self, epoch, i, batch, loss, aux):
        self.log.append(("update", epoch, i, aux))

    def summary(self, epoch):
        self.log.append(("summary", epoch))
        return {"epoch": epoch}

    def validate(self, epoch, record):
        self.log.append(("validate", epoch, record["epoch"]))

    def record(self, epoch, record, seconds):
        assert seconds >= 0
        self.log.append(("record", epoch, record["epoch"]))

    def save(self, epoch):
        self.log.append(("save", epoch))

    def after_epoch(self, epoch, record):
        self.log.append(("after", epoch, record["epoch"]))


def test_run_epochs_calls_the_hooks_in_the_documented_order():
    from robustest.train.engine import run_epochs

    loop = Recorder()
    run_epochs(loop, range(3, 5))
    epoch = [("forward", 0), ("update", 0, "aux0"), ("forward", 1), ("update", 1, "aux1")]
    expected = []
    for e in (3, 4):
        expected += [("stopped",), ("begin", e)] + [(t[0], e, *t[1:]) for t in epoch]
        expected += [("summary", e), ("validate", e, e), ("record", e, e), ("save", e), ("after", e, e)]
    assert loop.log == expected


def test_run_epochs_stops_before_the_epoch_after_the_guard_fires():
    from robustest.train.engine import run_epochs

    loop = Recorder(stop_after=1)
    run_epochs(loop, range(1, 4))
    assert [e for e in loop.log if e[0] in ("begin", "stopped")] == [("stopped",), ("begin", 1), ("stopped",)]


def test_a_non_finite_loss_raises_the_loops_message_before_its_update():
    from robustest.core.errors import TrainingDiverged
    from robustest.train.engine import run_epochs

    loop = Recorder(losses={(2, 1): float("nan")})
    with pytest.raises(TrainingDiverged, match=r"^diverged at epoch 2 step 1 \(aux1, loss nan\)$"):
        run_epochs(loop, range(1, 3))
    assert loop.log[-1] == ("forward", 2, 1) and ("update", 2, 0, "aux0") in loop.log


def test_run_epochs_shows_a_progress_bar_over_the_epochs_when_asked(monkeypatch):
    from robustest.train import engine

    seen = []

    def bar(iterable, *, enabled, desc, unit):
        seen.append((list(iterable), enabled, desc, unit))
        return seen[-1][0]

    monkeypatch.setattr(engine, "progress_bar", bar)
    engine.run_epochs(Recorder(), range(1, 3), progress=True, desc="harden")
    engine.run_epochs(Recorder(), range(5, 6))
    assert seen == [([1, 2], True, "harden", "epoch"), ([5], False, None, "epoch")]


@pytest.mark.parametrize("loss, others, raises", [
    (1.0, 0.0, False),               # finite here and on the other rank
    (1.0, 1.0, True),                # another rank saw a non-finite loss: every rank stops
    (float("inf"), 0.0, True),       # this rank's own
    (-float("inf"), 0.0, True),
])
def test_check_finite_under_ddp_stops_every_rank_together(monkeypatch, loss, others, raises):
    from robustest.core import distributed
    from robustest.core.errors import TrainingDiverged
    from robustest.train.engine import check_finite

    summed = []

    def reduce(t):
        summed.append(t.clone())
        return t + others

    monkeypatch.setattr(distributed, "all_reduce_sum", reduce)
    if raises:
        with pytest.raises(TrainingDiverged, match="^stop$"):
            check_finite(torch.tensor(loss), lambda: "stop", ddp=True)
    else:
        check_finite(torch.tensor(loss), lambda: "stop", ddp=True)
    assert len(summed) == 1 and summed[0].dtype == torch.float32 and summed[0].shape == (1,)
    assert summed[0].item() == (0.0 if loss == 1.0 else 1.0)
    summed.clear()
    check_finite(torch.tensor(1.0), lambda: "never", ddp=False)
    assert summed == []  # one process: no collective
    with pytest.raises(TrainingDiverged, match="^local$"):
        check_finite(torch.tensor(float("nan"), requires_grad=True) * 1, lambda: "local")


def test_bad_images_are_named_training_images_on_every_path():
    import numpy as np

    from robustest.core.errors import DataError
    from robustest.data.dataset import ImageDataset

    x = np.zeros((3, 1, 4, 4), np.float32)
    x[1] = np.nan
    stored = TrainData(ImageDataset(x, np.array([0, 1, 0])), 2, seed=0)
    assert stored.gather(torch.tensor([0, 2]))[0].shape == (2, 1, 4, 4)
    with pytest.raises(DataError, match="^training images contains NaN or infinite values"):
        stored.gather(torch.tensor([0, 1]))
    pixels = torch.utils.data.TensorDataset(torch.full((3, 1, 4, 4), 255.0), torch.tensor([0, 1, 0]))
    loader = TrainData(torch.utils.data.DataLoader(pixels, batch_size=2), 2, seed=0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
    with pytest.raises(DataError, match=r"^training images values lie in \[255, 255\] but must lie in \[0, 1\]"):
        loader.check(model, torch.device("cpu"))
    with pytest.raises(DataError, match=r"^training images values lie in \[255, 255\]"):
        list(loader.indexed_epoch(1, 2))


def test_epoch_passes_its_number_to_the_sampler():
    parts = TrainData(Plain(12), 4, seed=0, shard=Shard(0, 2))
    for e in (1, 2):
        plain = [x for x, _ in parts.epoch(e, 3)]
        indexed = [b[1] for b in parts.indexed_epoch(e, 3)]
        assert all(torch.equal(a, b) for a, b in zip(plain, indexed)) and len(plain) == len(indexed) == 3
    assert parts.loader.sampler.epoch == 2


def test_under_ddp_every_batchs_loss_check_is_shared_by_the_ranks(monkeypatch):
    """With ddp the finite check goes through an all-reduce (a rank whose loss is finite stops when another's is
    not); without it, no collective runs."""
    from robustest.core.errors import TrainingDiverged
    from robustest.train import engine

    calls = []

    def all_reduce_sum(t):
        calls.append(t.clone())
        return t + 1.0 if len(calls) == 3 else t  # another rank saw a non-finite loss at the third batch

    monkeypatch.setattr(engine.distributed, "all_reduce_sum", all_reduce_sum)
    engine.run_epochs(Recorder(), range(1, 2))
    assert calls == []
    with pytest.raises(TrainingDiverged, match=r"^diverged at epoch 2 step 0 \(aux0, loss 1.0\)$"):
        engine.run_epochs(Recorder(), range(1, 3), ddp=True)
    assert [float(c) for c in calls] == [0.0, 0.0, 0.0]
