"""robustest.core.stats.describe: the one summary of a 1-D tensor, exact on hand-computed values."""

from __future__ import annotations

import pytest
import torch

from robustest.core.stats import describe


def test_every_statistic_on_four_values():
    v = torch.tensor([4.0, 1.0, 3.0, 2.0])
    d = describe(v, ("count", "mean", "std", "min", "max", "median", "q50", "q25", "q00", "q99"))
    assert d == pytest.approx({"count": 4, "mean": 2.5, "std": (5 / 3) ** 0.5, "min": 1.0, "max": 4.0,
                               "median": 2.0, "q50": 2.5, "q25": 1.75, "q00": 1.0, "q99": 3.97})
    assert isinstance(d["count"], int)  # torch's median is the lower middle value, q50 the midpoint


def test_keys_can_name_other_statistics_and_keep_their_order():
    d = describe(torch.tensor([1.0, 2.0, 4.0]), {"n": "count", "median": "q50", "top": "max"})
    assert list(d) == ["n", "median", "top"] and d == {"n": 3, "median": 2.0, "top": 4.0}


def test_one_value_has_zero_spread_and_finite_drops_nan_and_inf():
    assert describe(torch.tensor([5.0]), ("std", "q75")) == {"std": 0.0, "q75": 5.0}
    assert describe(torch.tensor([1.0, float("nan"), float("inf"), 3.0]), ("count", "mean"), finite=True) == {
        "count": 2, "mean": 2.0}


def test_unknown_statistics_and_empty_tensors_are_refused():
    with pytest.raises(ValueError, match="unknown statistic"):
        describe(torch.ones(2), ("mode",))
    with pytest.raises(ValueError, match="unknown statistic"):
        describe(torch.ones(2), ("q5",))  # two digits: q05
    with pytest.raises(ValueError, match="no value"):
        describe(torch.empty(0), ("mean",))
    assert describe(torch.empty(0), ("count",)) == {"count": 0}
    assert describe(torch.tensor([float("nan")]), ("count",), finite=True) == {"count": 0}
