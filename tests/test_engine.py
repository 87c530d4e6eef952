"""The training engine's data side (robustest.train.engine.TrainData): how many steps an epoch takes and which
samples each batch holds, at the boundaries of the batch size and of the ranks."""

from __future__ import annotations

import pytest
import torch

from robustest.core.distributed import Shard
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
    with pytest.raises(DataError, match="training labels"):
        td.check(model, torch.device("cpu"))
    loader = TrainData(Plain(6), 4, seed=0)
    with pytest.raises(DataError, match="training labels"):
        list(loader.indexed_epoch(1, 2))
