"""Selection strategies: property-based tests of counts, distinctness, ends, sections and seeding."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robustest import selection
from robustest.core.errors import ConfigError
from robustest.selection import select

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False, width=32)
pools = st.one_of(
    st.lists(finite, min_size=1, max_size=200),
    # skewed: almost everything in one place, a few outliers
    st.tuples(st.integers(1, 150), st.lists(finite, min_size=0, max_size=3)).map(lambda t: [0.0] * t[0] + t[1]),
    # constant
    st.tuples(st.integers(1, 100), finite).map(lambda t: [t[1]] * t[0]),
    # many ties on a few values
    st.lists(st.sampled_from([0.0, 1.0, 2.0, 10.0]), min_size=1, max_size=120),
)
SCORE_STRATEGIES = ["best", "kmst", "top", "bottom", "random", "stratified"]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(scores=pools, frac=st.floats(0, 1), strategy=st.sampled_from(SCORE_STRATEGIES), k=st.integers(1, 12),
       seed=st.integers(0, 2**31 - 1))
def test_exact_count_distinct_in_range_and_deterministic(scores, frac, strategy, k, seed):
    n = int(round(frac * len(scores)))
    idx = select(scores, n, strategy, k=k, seed=seed)
    assert idx.dtype == torch.int64
    assert idx.shape == (n,)
    assert len(set(idx.tolist())) == n
    assert n == 0 or (int(idx.min()) >= 0 and int(idx.max()) < len(scores))
    assert torch.equal(idx, select(scores, n, strategy, k=k, seed=seed))


@SETTINGS
@given(scores=pools, frac=st.floats(0, 1))
def test_best_takes_both_ends(scores, frac):
    s = np.asarray(scores, dtype=np.float64)
    n = int(round(frac * len(s)))
    idx = select(scores, n, "best").numpy()
    lo, hi = n // 2, n - n // 2
    chosen = s[idx]
    srt = np.sort(s)
    # the lowest n//2 chosen values are the n//2 smallest in the pool, the rest are the largest
    np.testing.assert_array_equal(np.sort(chosen[:lo]), srt[:lo])
    np.testing.assert_array_equal(np.sort(chosen[lo:]), srt[len(s) - hi:])


@SETTINGS
@given(scores=pools, k=st.integers(1, 12), seed=st.integers(0, 1000), data=st.data())
def test_kmst_draws_from_every_non_empty_section(scores, k, seed, data):
    sec = selection.sections(torch.tensor(scores, dtype=torch.float64), k)
    counts = torch.bincount(sec, minlength=k)
    nonempty = int((counts > 0).sum())
    n = data.draw(st.integers(min(nonempty, len(scores)), len(scores)))
    idx = select(scores, n, "kmst", k=k, seed=seed)
    got = torch.bincount(sec[idx], minlength=k)
    assert bool((got[counts > 0] >= 1).all())
    # shares are as even as the section sizes allow: a section below the fair share is exhausted
    short = got < got.max() - 1
    assert bool((got[short] == counts[short]).all())
    assert bool((got <= counts).all())


def test_kmst_equal_shares_on_uniform_scores():
    scores = torch.arange(400, dtype=torch.float32)
    idx = select(scores, 40, "kmst", k=4, seed=3)
    got = torch.bincount(selection.sections(scores, 4)[idx], minlength=4)
    assert got.tolist() == [10, 10, 10, 10]


def test_kmst_skewed_redistributes_shortfall():
    scores = torch.cat([torch.zeros(100), torch.tensor([50.0, 100.0])])
    idx = select(scores, 20, "kmst", k=4, seed=0)
    assert len(set(idx.tolist())) == 20
    assert {100, 101} <= set(idx.tolist())  # both thin sections contribute all they have
    assert select(torch.full((30,), 7.0), 12, "kmst", k=10).shape == (12,)


def test_sections_match_numpy_histogram():
    rng = np.random.default_rng(0)
    s = rng.normal(size=5000)
    counts = torch.bincount(selection.sections(torch.tensor(s), 7), minlength=7).numpy()
    np.testing.assert_array_equal(counts, np.histogram(s, bins=7)[0])


def test_different_seeds_differ_for_random_draws():
    s = torch.rand(1000)
    assert not torch.equal(select(s, 50, "random", seed=0), select(s, 50, "random", seed=1))
    assert not torch.equal(select(s, 50, "kmst", seed=0), select(s, 50, "kmst", seed=1))


def test_top_bottom_rank_order_and_ties():
    s = torch.tensor([0.5, 0.9, 0.1, 0.9, 0.3])
    assert select(s, 3, "top").tolist() == [1, 3, 0]
    assert select(s, 2, "bottom").tolist() == [2, 4]
    assert select(s.numpy(), 2, "top").tolist() == [1, 3]  # arrays accepted
    assert select([0.2, 0.1], 1, "top").tolist() == [0]


def test_coverage_greedy_hand_example():
    bits = torch.tensor([
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 1],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0],
    ], dtype=torch.bool)
    # step 1: input 1 (3 cells); step 2: input 2 (2 new cells); then nothing adds coverage: fill by total
    assert select(bits, 2, "coverage").tolist() == [1, 2]
    assert select(bits, 4, "coverage").tolist() == [1, 2, 0, 3]
    assert select(bits, 5, "coverage").tolist() == [1, 2, 0, 3, 4]
    rnd = select(bits, 4, "coverage", fill="random", seed=5)
    assert rnd[:2].tolist() == [1, 2] and len(set(rnd.tolist())) == 4


@settings(max_examples=40, deadline=None)
@given(n_in=st.integers(1, 40), n_cells=st.integers(1, 30), p=st.floats(0.0, 1.0), seed=st.integers(0, 99),
       frac=st.floats(0, 1))
def test_coverage_greedy_is_the_naive_greedy(n_in, n_cells, p, seed, frac):
    g = torch.Generator().manual_seed(seed)
    bits = torch.rand(n_in, n_cells, generator=g) < p
    n = int(round(frac * n_in))
    idx = select(bits, n, "coverage").tolist()
    assert len(idx) == n and len(set(idx)) == n
    covered = torch.zeros(n_cells, dtype=torch.bool)
    for step, i in enumerate(idx):
        gains = [int((bits[j] & ~covered).sum()) if j not in idx[:step] else -1 for j in range(n_in)]
        best = max(gains)
        if best > 0:
            assert i == gains.index(best)
        else:  # filling phase: most cells covered first, ties lower index
            rest = [j for j in range(n_in) if j not in idx[:step]]
            assert i == min(rest, key=lambda j: (-int(bits[j].sum()), j))
        covered |= bits[i]


def test_n_larger_than_pool_warns_and_returns_pool():
    with pytest.warns(UserWarning, match="whole pool"):
        idx = select(torch.rand(5), 9, "kmst")
    assert sorted(idx.tolist()) == [0, 1, 2, 3, 4]
    with pytest.warns(UserWarning):
        assert select(torch.zeros(3, 4, dtype=torch.bool), 10, "coverage").shape == (3,)


def test_zero_and_empty():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert select(torch.rand(5), 0, "best").shape == (0,)
    assert select(torch.zeros(0), 0, "kmst").shape == (0,)


def test_errors():
    with pytest.raises(ConfigError, match="n must be >= 0"):
        select(torch.rand(5), -1, "top")
    with pytest.raises(ConfigError, match="NaN"):
        select(torch.tensor([0.1, float("nan")]), 1, "best")
    with pytest.raises(ConfigError, match="infinite"):
        select(torch.tensor([0.1, float("inf")]), 1, "kmst")
    with pytest.raises(ConfigError, match="unknown selection strategy"):
        select(torch.rand(5), 1, "gini")
    with pytest.raises(ConfigError, match="1-D"):
        select(torch.rand(5, 2), 1, "top")
    with pytest.raises(ConfigError, match=r"\[N, F\]"):
        select(torch.rand(5), 1, "coverage")
    with pytest.raises(ConfigError, match="0/1"):
        select(torch.rand(5, 3), 1, "coverage")
    with pytest.raises(ConfigError, match="k must"):
        select(torch.rand(5), 1, "kmst", k=0)
    with pytest.raises(ConfigError, match="non-negative integer"):
        select(torch.rand(5), 1.5, "top")
    with pytest.raises(ConfigError, match="fill"):
        select(torch.zeros(2, 2, dtype=torch.bool), 1, "coverage", fill="x")


def test_names_and_describe():
    assert selection.names() == ["best", "kmst", "top", "bottom", "random", "coverage", "stratified", "fol-prop",
                                "kcenter"]
    assert "BE-ST" in selection.describe("best")
    with pytest.raises(ConfigError):
        selection.describe("nope")


# ------------------------------------------------------------------------------- stratified and fol-prop
@SETTINGS
@given(scores=pools, frac=st.floats(0, 1), seed=st.integers(0, 2**31 - 1), classes=st.integers(1, 5))
def test_fol_prop_and_labelled_stratified_exact_count_distinct_deterministic(scores, frac, seed, classes):
    s = torch.tensor(scores, dtype=torch.float64).abs()  # fol-prop needs non-negative weights
    n = int(round(frac * len(scores)))
    labels = torch.arange(len(scores)) % classes
    for strategy, kw in (("fol-prop", {}), ("stratified", {"labels": labels})):
        idx = select(s, n, strategy, seed=seed, **kw)
        assert idx.dtype == torch.int64 and idx.shape == (n,) and len(set(idx.tolist())) == n
        assert torch.equal(idx, select(s, n, strategy, seed=seed, **kw))


def test_quantile_bins_are_equal_frequency():
    s = torch.tensor([5.0, 1.0, 3.0, 2.0, 4.0, 0.0, 7.0, 6.0])
    assert selection.quantile_bins(s, 4).tolist() == [2, 0, 1, 1, 2, 0, 3, 3]
    b = selection.quantile_bins(torch.rand(1003), 7)
    counts = torch.bincount(b)
    assert len(counts) == 7 and int(counts.max() - counts.min()) <= 1
    assert sorted(selection.quantile_bins(torch.rand(3), 10).tolist()) == [0, 3, 6]
    with pytest.raises(ConfigError, match="k must"):
        selection.quantile_bins(torch.rand(3), 0)


def test_stratified_gives_every_stratum_its_proportional_share():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(997, generator=g)
    labels = torch.randint(0, 10, (997,), generator=g)
    bins = selection.quantile_bins(scores, 4)
    strata = labels * 4 + bins
    sizes = torch.bincount(strata, minlength=40).double()
    for n in (13, 40, 100, 500):
        for seed in range(5):
            idx = select(scores, n, "stratified", k=4, seed=seed, labels=labels)
            got = torch.bincount(strata[idx], minlength=40).double()
            share = sizes * n / 997
            assert bool((got >= torch.floor(share)).all()) and bool((got <= torch.ceil(share)).all())
            assert int(got.sum()) == n
    # equal strata: one from each at n = number of strata, which a uniform random draw rarely manages
    lab = torch.arange(400) % 10
    sc = torch.arange(400, dtype=torch.float64)  # each class spreads over every quantile bin
    one_each = select(sc, 40, "stratified", k=4, seed=3, labels=lab)
    st_ = lab[one_each] * 4 + selection.quantile_bins(sc, 4)[one_each]
    assert sorted(st_.tolist()) == list(range(40))
    # without labels the strata are the score bins alone
    idx = select(sc, 8, "stratified", k=4, seed=1)
    assert torch.bincount(selection.quantile_bins(sc, 4)[idx], minlength=4).tolist() == [2, 2, 2, 2]


def test_fol_prop_draws_in_proportion_to_the_score():
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0])
    first = torch.tensor([int(select(w, 1, "fol-prop", seed=s)[0]) for s in range(3000)])
    freq = torch.bincount(first, minlength=5).double() / 3000
    assert torch.allclose(freq, w.double() / 10, atol=0.03), freq
    assert int(freq[4]) == 0  # a score of 0 is never drawn while positive scores remain
    # a score of 0 comes last, only once every positive score is taken
    idx = select(w, 5, "fol-prop", seed=0)
    assert int(idx[-1]) == 4 and sorted(idx.tolist()) == [0, 1, 2, 3, 4]
    # inclusion rises with the score: pick 2 of 4, many seeds
    inc = torch.zeros(5)
    for s in range(500):
        inc[select(w, 2, "fol-prop", seed=s)] += 1
    assert inc[0] < inc[1] < inc[2] < inc[3] and inc[4] == 0


def test_new_strategy_errors():
    with pytest.raises(ConfigError, match="must be >= 0"):
        select(torch.tensor([0.5, -0.1]), 1, "fol-prop")
    with pytest.raises(ConfigError, match="labels apply to strategy 'stratified' only"):
        select(torch.rand(4), 1, "random", labels=torch.zeros(4, dtype=torch.long))
    with pytest.raises(ConfigError, match="one label per score"):
        select(torch.rand(4), 1, "stratified", labels=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ConfigError, match="integer class indices"):
        select(torch.rand(4), 1, "stratified", labels=torch.zeros(4))


# ------------------------------------------------------------------------------------------------ kcenter
def _kcenter_reference(f: torch.Tensor, n: int, first: int) -> list[int]:
    """k-center greedy written the slow, obvious way: recompute every distance to every centre each step."""
    f = f.double()
    out = [first]
    for _ in range(n - 1):
        d = torch.cdist(f, f[out]).min(dim=1).values
        d[out] = -1.0
        out.append(int(torch.argmax(d)))
    return out


def test_kcenter_known_answer_on_clusters():
    # four tight clusters at the corners of a square and one point in the middle: whatever the first centre,
    # the greedy takes one point of every corner before the middle, then the middle (farthest from all corners)
    g = torch.Generator().manual_seed(0)
    corners = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
    pts = torch.cat([corners.repeat_interleave(5, 0) + 0.01 * torch.rand(20, 2, generator=g),
                     torch.tensor([[5.0, 5.0]])])
    for seed in range(6):
        idx = select(pts, 5, "kcenter", seed=seed)
        first = int(idx[0])
        corners_hit = {int(i) // 5 for i in idx[:4]}
        if first == 20:  # the first centre drawn is the middle: then one of each corner
            assert {int(i) // 5 for i in idx[1:]} == {0, 1, 2, 3}
        else:
            assert corners_hit == {0, 1, 2, 3} and int(idx[4]) == 20
    # points on a line, worked by hand for every first centre (from 2.0: 0.0 and 4.0 tie at 2, the lower index wins)
    line = torch.tensor([[0.0], [1.0], [2.0], [4.0], [10.0]])
    known = {0: [0, 4, 3], 1: [1, 4, 3], 2: [2, 4, 0], 3: [3, 4, 0], 4: [4, 0, 3]}
    seen = set()
    for seed in range(40):
        idx = select(line, 3, "kcenter", seed=seed).tolist()
        assert idx == known[idx[0]]
        seen.add(idx[0])
    assert seen == set(known)


@given(st.integers(1, 60), st.integers(1, 6), st.integers(0, 2**31 - 1))
@SETTINGS
def test_kcenter_matches_the_obvious_greedy_and_is_seeded(num, dim, seed):
    f = torch.randn(num, dim, generator=torch.Generator().manual_seed(seed))
    n = max(1, num // 3)
    idx = select(f, n, "kcenter", seed=seed)
    assert idx.dtype == torch.int64 and idx.device.type == "cpu" and len(idx) == n == len(set(idx.tolist()))
    assert idx.tolist() == _kcenter_reference(f, n, int(idx[0]))
    assert torch.equal(idx, select(f, n, "kcenter", seed=seed))  # same seed, same selection
    firsts = {int(select(f, 1, "kcenter", seed=s)[0]) for s in range(20)}
    assert num == 1 or len(firsts) > 1  # the first centre comes from the seed


def test_kcenter_duplicates_whole_pool_and_errors():
    dup = torch.tensor([[0.0], [0.0], [0.0], [1.0]])
    idx = select(dup, 4, "kcenter", seed=0)
    assert sorted(idx.tolist()) == [0, 1, 2, 3]
    assert set(select(dup, 2, "kcenter", seed=1).tolist()) in ({0, 3}, {1, 3}, {2, 3})  # distinct points first
    with pytest.warns(UserWarning, match="whole pool"):
        assert len(select(dup, 9, "kcenter")) == 4
    assert len(select(dup, 0, "kcenter")) == 0
    with pytest.raises(ConfigError, match=r"\[N, D\] of features"):
        select(torch.rand(5), 2, "kcenter")
    with pytest.raises(ConfigError, match="NaN or infinite"):
        select(torch.tensor([[0.0], [float("nan")]]), 1, "kcenter")
    assert "core-set" in selection.describe("kcenter")


def test_stratified_gives_the_leftover_to_the_largest_fraction_not_the_largest_stratum():
    # one score bin x 2 classes: strata of 7 and 2; n = 3 -> quotas 2.33 and 0.67 -> 2 + 1
    labels = torch.tensor([0] * 7 + [1] * 2)
    for seed in range(5):
        picked = selection.select(torch.arange(9.0), 3, "stratified", k=1, labels=labels, seed=seed)
        assert torch.bincount(labels[picked], minlength=2).tolist() == [2, 1]


def test_fol_prop_draws_exponential_keys_in_double_precision():
    scores = torch.tensor([0.5, 2.0, 0.0, 1.0, 3.0, 0.25])
    picked = selection.select(scores, 4, "fol-prop", seed=11)
    gen = torch.Generator().manual_seed(11)
    u = torch.rand(6, generator=gen, dtype=torch.float64)
    pos = torch.tensor([0, 1, 3, 4, 5])
    keys = torch.log(u[pos]) / scores[pos].double()
    assert picked.tolist() == pos[torch.argsort(keys, descending=True)][:4].tolist()
    assert picked.dtype == torch.int64


def test_selection_returns_int64_positions_for_int32_labels():
    labels = torch.tensor([0, 1, 0, 1, 0, 1], dtype=torch.int32)
    picked = selection.select(torch.arange(6.0), 4, "stratified", k=2, labels=labels, seed=0)
    assert picked.dtype == torch.int64 and len(set(picked.tolist())) == 4
