"""core/compute.py, the one home of compute in passes: the formula, the tallied ComputeCount and the measured
PassCounter agree on what a pass is."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from robustest.core.compute import ComputeCount, PassCounter, passes_of


@pytest.mark.parametrize("forward, backward, expected", [(3, 3, 3.0), (3, 0, 1.0), (0, 3, 2.0), (0, 0, 0.0),
                                                         (1, 2, 5 / 3)])
def test_a_pass_is_a_third_forward_two_thirds_backward(forward, backward, expected):
    assert passes_of(forward, backward) == pytest.approx(expected)


def test_compute_count_splits_attack_and_update_and_round_trips():
    c = ComputeCount(attack_forward=4, attack_backward=4, train_forward=6, train_backward=3)
    assert (c.forward, c.backward, c.passes, c.attack_passes) == (10, 7, 8.0, 4.0)
    d = c.to_dict()
    assert d["train_passes"] == 4.0 and d["passes"] == 8.0
    assert ComputeCount.from_dict(d) == c
    assert c.add(ComputeCount(1, 2, 3, 4)) == ComputeCount(5, 6, 9, 7)


def test_measured_and_tallied_counts_agree_on_a_training_step():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    x, y = torch.rand(5, 4), torch.tensor([0, 1, 0, 1, 1])
    with PassCounter(model) as pc:
        nn.functional.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            model(x[:3])
    tallied = ComputeCount(train_forward=5 + 3, train_backward=5)
    assert (pc.forward, pc.backward) == (tallied.forward, tallied.backward) == (8, 5)
    assert pc.passes == tallied.passes == pytest.approx(6.0)
