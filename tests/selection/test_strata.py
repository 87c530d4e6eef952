"""The one stratification module (robustest.selection.strata): bins, Neyman's target, the two allocations and the
draw inside the strata, on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from robustest.core.errors import ConfigError
from robustest.selection.strata import (
    ALLOCATIONS,
    allocate,
    draw_in_strata,
    equal_bins,
    neyman_target,
    quantile_bins,
    random_remainders,
)


def test_equal_bins_cut_a_ranking_into_runs_of_equal_length():
    assert equal_bins(10, 3).tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]  # floor(i * 3 / 10)
    assert equal_bins(4, 4).tolist() == [0, 1, 2, 3] and equal_bins(3, 1).tolist() == [0, 0, 0]
    assert equal_bins(0, 2).tolist() == []
    assert quantile_bins(torch.tensor([0.9, 0.1, 0.5, 0.5]), 2).tolist() == [1, 0, 0, 1]  # ties: lower index first


def test_neyman_target_is_size_times_the_bernoulli_deviation():
    stratum = torch.tensor([0, 0, 1, 1, 1, 1, 2])
    pilot = torch.tensor([0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1.0])
    t = neyman_target(stratum, pilot, 3)
    # stratum 0: p = 0.5, 2 * 0.5; stratum 1: p = 0.5, 4 * 0.5; stratum 2: p = 1, no deviation
    assert t.dtype == torch.float64 and t.tolist() == [1.0, 2.0, 0.0]
    assert neyman_target(torch.tensor([0, 0, 1]), torch.tensor([0.25, 0.25, 0.0]), 2).tolist() == \
        [2 * math.sqrt(0.25 * 0.75), 0.0]


def test_allocate_follows_the_target_within_floor_and_caps():
    assert ALLOCATIONS == ("proportional", "neyman")
    # ideal 6 * [1/3, 2/3, 0] = [2, 4, 0]; the floor lifts stratum 2 to 1, one too many: it leaves the first of
    # the strata equally far above their ideal (stratum 2 is at its floor)
    assert allocate(torch.tensor([1.0, 2.0, 0.0]), 6, torch.tensor([10, 10, 10]), 1).tolist() == [1, 4, 1]
    assert allocate(torch.zeros(2), 4, torch.tensor([1, 3]), 0).tolist() == [1, 3]  # all zero: by size
    assert allocate(torch.zeros(2), 8, torch.tensor([10, 30]), 0).tolist() == [2, 6]  # by size, below the caps
    assert allocate(torch.tensor([9.0, 1.0]), 5, torch.tensor([2, 8]), 1).tolist() == [2, 3]  # capped at 2
    with pytest.raises(ConfigError, match="^cannot draw 11 samples from 10$"):
        allocate(torch.ones(2), 11, torch.tensor([5, 5]), 1)
    with pytest.raises(ConfigError, match="^K = 3 is too small for 2 strata of at least 2 samples$"):
        allocate(torch.ones(2), 3, torch.tensor([5, 5]), 2)


def test_random_remainders_give_leftovers_to_the_largest_fractions():
    gen = torch.Generator().manual_seed(0)
    # quotas 5 * [3, 1, 6] / 10 = 1.5, 0.5, 3.0: floors 1, 0, 3, one unit left for a fraction of 0.5 (a tie)
    got = [random_remainders(torch.tensor([3, 1, 6]), 5, gen).tolist() for _ in range(20)]
    assert set(map(tuple, got)) == {(2, 0, 3), (1, 1, 3)}  # the tie is broken both ways over the draws
    assert random_remainders(torch.tensor([4, 4]), 4, gen).tolist() == [2, 2]  # no remainder, no draw


def test_draw_in_strata_takes_each_strata_share_without_replacement():
    stratum = torch.tensor([0, 1, 0, 1, 0, 2])
    picked = draw_in_strata(stratum, torch.tensor([2, 1, 0]), torch.Generator().manual_seed(3))
    assert [len(p) for p in picked] == [2, 1, 0]
    assert set(picked[0].tolist()) <= {0, 2, 4} and len(set(picked[0].tolist())) == 2
    assert set(picked[1].tolist()) <= {1, 3}
    again = draw_in_strata(stratum, torch.tensor([2, 1, 0]), torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(picked, again))  # seeded
    assert sorted(draw_in_strata(stratum, torch.tensor([3, 2, 1]), torch.Generator())[0].tolist()) == [0, 2, 4]
