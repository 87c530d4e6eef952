"""DeepGini, entropy, margin and max-probability against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from robustest import metrics
from robustest.core.errors import ConfigError, DataError


def test_from_logits_hand_values():
    probs = torch.tensor([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3], [0.9, 0.05, 0.05]])
    logits = probs.log() + 1.7  # softmax is shift invariant
    torch.testing.assert_close(metrics.gini_from_logits(logits), torch.tensor([0.62, 2 / 3, 1 - 0.81 - 0.005]))
    ent = torch.tensor([
        -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2)),
        math.log(3),
        -(0.9 * math.log(0.9) + 0.1 * math.log(0.05)),
    ])
    torch.testing.assert_close(metrics.entropy_from_logits(logits), ent)
    torch.testing.assert_close(metrics.margin_from_logits(logits), torch.tensor([0.2, 0.0, 0.85]))
    torch.testing.assert_close(metrics.max_prob_from_logits(logits), torch.tensor([0.5, 1 / 3, 0.9]))


def test_saturated_logits_stay_finite():
    logits = torch.tensor([[1000.0, 0.0, -1000.0]])
    assert metrics.entropy_from_logits(logits).item() == pytest.approx(0.0, abs=1e-6)
    assert metrics.gini_from_logits(logits).item() == pytest.approx(0.0, abs=1e-6)
    assert metrics.margin_from_logits(logits).item() == pytest.approx(1.0)


def test_model_versions_equal_logit_versions_and_restore_mode():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 5), nn.Dropout(0.5))
    model.train()
    x = torch.rand(23, 1, 4, 4)
    with torch.no_grad():
        logits = model.eval()(x)
    model.train()
    for name in ["gini", "entropy", "margin", "max_prob"]:
        f = getattr(metrics, name)
        g = getattr(metrics, f"{name}_from_logits")
        torch.testing.assert_close(f(model, x), g(logits))
        torch.testing.assert_close(f(model, x, batch_size=4), g(logits))
    assert model.training


def test_uniform_prediction_is_most_uncertain():
    logits = torch.zeros(2, 10)
    assert metrics.gini_from_logits(logits)[0].item() == pytest.approx(0.9)
    assert metrics.entropy_from_logits(logits)[0].item() == pytest.approx(math.log(10))
    assert metrics.max_prob_from_logits(logits)[0].item() == pytest.approx(0.1)


def test_errors():
    with pytest.raises(DataError, match="at least 2"):
        metrics.margin_from_logits(torch.zeros(3, 1))
    with pytest.raises(DataError, match=r"\[N, K\]"):
        metrics.gini_from_logits(torch.zeros(3))
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 5))
    with pytest.raises(DataError):
        metrics.gini(model, torch.rand(3, 16))
    with pytest.raises(ConfigError, match="batch_size"):
        metrics.entropy(model, torch.rand(3, 1, 4, 4), batch_size=-1)
    with pytest.raises(ConfigError, match="nn.Module"):
        metrics.max_prob("model", torch.rand(3, 1, 4, 4))
