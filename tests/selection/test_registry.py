"""A selection strategy registered from outside the package: selectable through robustest.selection.select, with
its inputs checked as it declares, accepted by the RobOT config and fed by the robot from the pool, and gone
again once unregistered."""

from __future__ import annotations

import warnings

import pytest
import torch

from robustest import robot, selection
from robustest.core.errors import ConfigError
from robustest.robot.pool import K_KEYS, Pool, reads_fol, select_tests
from robustest.selection import Request, Strategy


def closest_to_median(req: Request) -> torch.Tensor:
    """The ``n`` scores closest to the median, closest first (ties: lower index first)."""
    s = req.inputs
    return torch.sort((s - s.median()).abs(), stable=True).indices[:req.n]


def per_class_lowest(req: Request) -> torch.Tensor:
    """The lowest score of each class first (classes in label order), then the rest by score; uses labels and k."""
    assert req.labels is not None and req.k == 3
    first = torch.stack([torch.nonzero(req.labels == c).flatten()[torch.argmin(req.inputs[req.labels == c])]
                         for c in torch.unique(req.labels)])
    rest = torch.sort(req.inputs, stable=True).indices
    rest = rest[~torch.isin(rest, first)]
    return torch.cat([first, rest])[:req.n]


MEDIAN = Strategy("median", "the n scores closest to the median", closest_to_median)


def test_registered_strategy_selects_and_is_checked_as_declared():
    scores = torch.tensor([5.0, 1.0, 3.0, 9.0, 3.5, -2.0, 2.5])
    assert "median" not in selection.names()
    with selection.registered(MEDIAN) as spec:
        assert spec is MEDIAN and selection.get("median") is MEDIAN
        assert selection.names()[-1] == "median"
        assert selection.describe("median") == "median: the n scores closest to the median"
        idx = selection.select(scores, 3, "median")
        assert idx.dtype == torch.int64 and idx.tolist() == [2, 4, 6]
        assert selection.select(scores.tolist(), 0, "median").tolist() == []
        with pytest.raises(ConfigError, match="1-D tensor"):  # needs scores: a 2-D input is refused
            selection.select(torch.rand(4, 2), 2, "median")
        with pytest.raises(ConfigError, match="NaN"):
            selection.select(torch.tensor([1.0, float("nan")]), 1, "median")
        with pytest.raises(ConfigError, match="labels apply to strategy 'stratified' only, not 'median'"):
            selection.select(scores, 2, "median", labels=torch.zeros(7, dtype=torch.long))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert len(selection.select(scores, 50, "median")) == 7
        assert "pool holds only 7" in str(caught[0].message)
        with pytest.raises(ConfigError, match="already registered"):
            selection.register(MEDIAN)
    assert "median" not in selection.names()
    with pytest.raises(ConfigError, match="unknown selection strategy 'median'"):
        selection.select(scores, 3, "median")


def test_registered_strategy_is_a_robot_strategy_while_registered():
    assert "median" not in robot.strategies()
    with pytest.raises(ConfigError, match="unknown strategy 'median'"):
        robot.RobotConfig.from_dict({"strategy": "median"})
    with selection.registered(MEDIAN):
        assert robot.selection_strategies()[-1] == "median"
        assert robot.strategies().index("median") < robot.strategies().index("all")
        assert robot.RobotConfig.from_dict({"strategy": "median"}).strategy == "median"
        cfg = robot.RobotConfig.from_dict({"strategies": ["median", "random", "gini"], "budgets": ["10%"]})
        assert cfg.strategies == ["median", "random", "gini"]
        assert robot.RobotConfig.json_schema()["properties"]["strategy"]["enum"][8] == "median"
        assert reads_fol("median") and not reads_fol("random") and not reads_fol("gini")
    assert "median" not in robot.strategies()
    with pytest.raises(ConfigError, match="unknown strategy 'median' in strategies"):
        robot.RobotConfig.from_dict({"strategies": ["median", "random"]})


def test_robot_feeds_a_registered_strategy_what_it_declares(monkeypatch):
    g = torch.Generator().manual_seed(0)
    fol = torch.rand(12, generator=g, dtype=torch.float64).float()
    y = torch.tensor([0, 1, 2] * 4)
    pool = Pool(torch.rand(12, 1, 2, 2, generator=g), y, torch.arange(12), ["pgd"] * 12, fol)
    spec = Strategy("per-class", "lowest FOL of each class first", per_class_lowest, labels=True, options=("k",))
    with selection.registered(spec), selection.registered(MEDIAN):
        robot.RobotConfig.from_dict({"strategies": ["per-class", "median"], "kmst_k": 3})
        compute: dict = {}
        cfg = robot.RobotConfig(kmst_k=3)
        got = select_tests("median", None, pool, 4, cfg, seed=1, cache={"fol_passes": 12.0}, compute=compute)
        assert torch.equal(got, selection.select(pool.fol, 4, "median"))
        assert compute["selection_scoring"] == 12.0  # it reads the pool's FOL: the FOL scoring is its cost
        # it takes labels: the robot passes the pool's, and k from kmst_k ...
        got = select_tests("per-class", None, pool, 5, cfg, seed=1)
        assert sorted(y[got[:3]].tolist()) == [0, 1, 2] and len(set(got.tolist())) == 5
        assert torch.equal(got, selection.select(pool.fol, 5, "per-class", k=3, labels=y))
        # ... or from the config key the robot maps it to
        monkeypatch.setitem(K_KEYS, "per-class", "stratified_bins")
        cfg = robot.RobotConfig(kmst_k=4, stratified_bins=3)
        assert torch.equal(select_tests("per-class", None, pool, 5, cfg, seed=1), got)


def test_register_refuses_bad_records_and_unregister_cleans_up():
    for name in ("", "   ", 3, None):  # an empty or blank name, or none that is a string
        with pytest.raises(ConfigError, match=f"^a selection strategy needs a name, got {name!r}$"):
            Strategy(name, "d", closest_to_median)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs must be one of scores, bits, features"):
        Strategy("x", "d", closest_to_median, needs="pixels")
    with pytest.raises(ConfigError, match="unknown option 'eps'"):
        Strategy("x", "d", closest_to_median, options=("eps",))
    with pytest.raises(ConfigError, match="fn must be callable"):
        Strategy("x", "d", None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="takes a robustest.selection.Strategy"):
        selection.register("median")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown selection strategy 'median'"):
        selection.unregister("median")
    before = selection.names()
    selection.register(MEDIAN)
    try:
        assert selection.names() == [*before, "median"]
    finally:
        assert selection.unregister("median") is MEDIAN
    assert selection.names() == before
    with pytest.raises(RuntimeError), selection.registered(MEDIAN):
        raise RuntimeError("the block fails")
    assert selection.names() == before
    replaced = Strategy("top", "d", closest_to_median)
    original = selection.get("top")
    with pytest.raises(ConfigError, match="already registered"):
        selection.register(replaced)
    assert selection.get("top") is original
