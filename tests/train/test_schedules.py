"""Exact values of the per-batch learning-rate schedules (robustest.train.schedules.make_schedule) at their
boundaries: one-step runs, a warm-up of exactly one step, the cyclic peak, the end of a cosine schedule."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from robustest.train import recipes, schedules


def factors(opts: recipes.Recipe, epochs: int, steps: int, upto: int | None = None) -> list[float]:
    """The schedule's LR factor at steps 0 .. upto-1 (default: every training step and the one after)."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = schedules.make_schedule(opt, opts, epochs, steps)
    assert sched is not None
    fn = sched.lr_lambdas[0]
    return [fn(s) for s in range(upto if upto is not None else epochs * steps + 1)]


def test_no_schedule_and_no_warmup_is_none_but_one_warmup_step_is_a_schedule():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    assert schedules.make_schedule(opt, recipes.Recipe().check(2), 2, 3) is None
    # warm-up of 1/3 epoch = exactly one step: a schedule whose first step trains at the full rate
    assert factors(recipes.Recipe(warmup_epochs=1 / 3).check(2), 2, 3, upto=3) == [1.0, 1.0, 1.0]
    assert factors(recipes.Recipe(warmup_epochs=2 / 3).check(2), 2, 3, upto=3) == [0.5, 1.0, 1.0]


def test_cosine_after_one_warmup_step_starts_at_the_full_rate_and_ends_at_zero():
    # 2 steps, 1 of warm-up: step 0 is the warm-up's (0 + 1) / 1, step 1 the cosine's start, step 2 its end (0)
    f = factors(recipes.Recipe(schedule="cosine", warmup_epochs=1).check(2), 2, 1)
    assert f == pytest.approx([1.0, 1.0, 0.0], abs=1e-12)


def test_cosine_of_one_step_reaches_zero_after_it():
    assert factors(recipes.Recipe(schedule="cosine").check(1), 1, 1) == pytest.approx([1.0, 0.0], abs=1e-12)
    f = factors(recipes.Recipe(schedule="cosine").check(1), 1, 4)
    assert f == pytest.approx([0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(5)], abs=1e-12)


def test_cyclic_peaks_at_two_fifths_and_falls_to_zero():
    # 10 steps: peak 4; step s trains at (s + 1) / 4 up to the peak, then (10 - (s + 1)) / 6
    f = factors(recipes.Recipe(schedule="cyclic").check(1), 1, 10, upto=10)
    assert f == pytest.approx([0.25, 0.5, 0.75, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0.0])


def test_cyclic_short_runs_keep_a_peak_of_at_least_one_step():
    # one step: the peak is the step itself, trained at the full rate (not at 0)
    assert factors(recipes.Recipe(schedule="cyclic").check(1), 1, 1, upto=1) == [1.0]
    # two steps: peak max(1, 0.8) = 1, the second step at (2 - 2) / 1 = 0
    assert factors(recipes.Recipe(schedule="cyclic").check(1), 1, 2, upto=2) == [1.0, 0.0]
    # three steps: peak 1.2, descent over max(1, 1.8) = 1.8 steps
    f = factors(recipes.Recipe(schedule="cyclic").check(1), 1, 3, upto=3)
    assert f == pytest.approx([1 / 1.2, (3 - 2) / 1.8, 0.0])


def test_step_schedule_drops_at_the_default_milestones_and_at_given_epochs():
    f = factors(recipes.Recipe(schedule="step").check(4), 4, 2, upto=8)
    assert f == pytest.approx([1, 1, 1, 1, 0.1, 0.1, 0.01, 0.01])
    g = factors(recipes.Recipe(schedule="step", milestones=[1, 3]).check(4), 4, 2, upto=8)
    assert g == pytest.approx([1, 1, 0.1, 0.1, 0.1, 0.1, 0.01, 0.01])


def test_zero_steps_is_treated_as_one():
    # an empty epoch must not divide by zero: total = max(1, 0) = 1
    assert factors(recipes.Recipe(schedule="cosine").check(1), 1, 0, upto=2) == pytest.approx([1.0, 0.0], abs=1e-12)
