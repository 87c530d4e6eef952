"""The regression gate's rules at their boundaries, without a model: the verdict rule (one-sided exact McNemar
p-value below alpha AND a drop larger than max_drop), when score strata are crossed with the classes, and the
Neyman allocation of the suite's samples."""

from __future__ import annotations

import pytest
import torch

from robustest.core.errors import ConfigError
from robustest.suite.build import MIN_PER_STRATUM, make_strata, stratified_draw
from robustest.suite.check import regressed
from robustest.suite.stats import paired_difference


def five_broken(n: int = 40):
    """Baseline right on all n samples, the candidate wrong on 5 of them: b = 5, c = 0 in one stratum of n."""
    base = torch.ones(n, dtype=torch.bool)
    cand = base.clone()
    cand[:5] = False
    return paired_difference(base, cand, torch.zeros(n, dtype=torch.long), torch.tensor([n]))


def test_five_discordant_pairs_one_way_are_a_regression_at_alpha_five_percent():
    d = five_broken()
    assert (d.b, d.c) == (5, 0) and d.drop == 0.125
    assert d.p_value == 1 / 32 and d.p_two_sided == 1 / 16  # the two-sided p would let this regression pass
    assert regressed(d, 0.05, 0.0) is True
    assert regressed(d, 0.05, 0.124) is True


def test_the_verdict_rule_boundaries():
    d = five_broken()
    assert regressed(d, 0.05, 0.125) is False  # a drop of exactly max_drop passes
    assert regressed(d, 1 / 32, 0.0) is False  # p equal to alpha is not significant
    assert regressed(d, 1 / 32 + 1e-12, 0.0) is True
    better = paired_difference(torch.zeros(40, dtype=torch.bool), torch.ones(40, dtype=torch.bool),
                               torch.zeros(40, dtype=torch.long), torch.tensor([40]))
    assert better.drop == -1.0 and regressed(better, 0.999, -2.0) is False  # a better candidate is never significant


def test_classes_are_crossed_from_exactly_two_samples_per_cell():
    assert MIN_PER_STRATUM == 2
    order, labels = torch.arange(16), torch.arange(16) % 2  # 2 score bins x 2 classes = 4 cells of 4 samples
    stratum, desc, crossed = make_strata(order, labels, k=8, strata=2)
    assert crossed and len(desc) == 4 and torch.bincount(stratum).tolist() == [4, 4, 4, 4]
    assert desc[0] == {"bin": 0, "class": 0} and desc[3] == {"bin": 1, "class": 1}
    stratum, desc, crossed = make_strata(order, labels, k=7, strata=2)  # K = 2 x cells - 1: bins only
    assert not crossed and [d["class"] for d in desc] == [-1, -1] and torch.bincount(stratum).tolist() == [8, 8]
    with pytest.raises(ConfigError, match="cannot cross 2 score strata"):
        make_strata(order, labels, k=7, strata=2, by_class="yes")
    # a cell of one sample cannot be a stratum
    _, _, crossed = make_strata(torch.arange(5), torch.tensor([0, 0, 1, 1, 1]), k=20, strata=2)
    assert not crossed


class Analysis:
    def __init__(self, frac: list[float], clean: list[bool] | None = None) -> None:
        self.n = len(frac)
        self.label = torch.zeros(self.n, dtype=torch.long)
        self.frac_misclassified = torch.tensor(frac)
        self.clean_correct = torch.ones(self.n, dtype=torch.bool) if clean is None else torch.tensor(clean)

    def __len__(self) -> int:
        return self.n

    def order(self) -> torch.Tensor:
        return torch.arange(self.n)


def test_neyman_allocation_follows_the_strata_standard_deviations():
    # 4 strata of 10: pilot error rates 0.5, 0.1, 0, 0 -> N_h * sd_h = 5, 3, 0, 0; K = 16 with 2 per stratum at
    # least: ideal 10, 6, 0, 0 -> floors lift strata 3 and 4 to 2, the two largest give back 2 each in turn
    a = Analysis([0.5] * 10 + [0.1] * 10 + [0.0] * 20)
    picked, stratum, alloc, desc, crossed = stratified_draw(a, 16, strata=4, by_class="no", allocation="neyman")
    assert alloc.tolist() == [8, 4, 2, 2] and not crossed
    assert torch.bincount(stratum[picked], minlength=4).tolist() == [8, 4, 2, 2]
    assert picked.tolist() == sorted(set(picked.tolist()))
    prop = stratified_draw(a, 16, strata=4, by_class="no", allocation="proportional")[2]
    assert prop.tolist() == [4, 4, 4, 4]


def test_neyman_counts_a_clean_error_as_certain_failure():
    # stratum 0 misclassified clean (rate 1, sd 0) and stratum 1 at 0.5: every spare sample goes to stratum 1
    a = Analysis([0.0] * 10 + [0.5] * 10, clean=[False] * 10 + [True] * 10)
    alloc = stratified_draw(a, 12, strata=2, by_class="no", allocation="neyman")[2]
    assert alloc.tolist() == [2, 10]
    with pytest.raises(ConfigError, match="unknown allocation 'optimal'"):
        stratified_draw(a, 12, strata=2, by_class="no", allocation="optimal")
