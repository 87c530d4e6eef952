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
