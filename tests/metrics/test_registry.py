"""The metrics' registry entries (robustest.metrics.info): what each metric takes."""

from __future__ import annotations

import pytest
import torch

from robustest import metrics, models
from robustest.metrics.scoring import score


def test_each_metric_names_the_options_it_takes():
    assert {n: metrics.info(n).options for n in metrics.names() if metrics.info(n).options} == {
        "fol": ("eps", "norm", "label"), "fol_gradnorm": ("label",), "nc": ("threshold",), "kmnc": ("k",),
        "nbc": ("scale",), "snac": ("scale",), "tknc": ("top_k",)}


VALUES = {"eps": 0.2, "norm": "l2", "label": "pred", "threshold": 0.3, "k": 3, "scale": 0.1, "top_k": 2}


@pytest.mark.parametrize("name", [n for n in metrics.names() if metrics.info(n).options])
def test_the_options_reach_the_metric_and_are_recorded(name):
    torch.manual_seed(0)
    model = models.create("digits_cnn", input_size=8)
    data = (torch.rand(6, 1, 8, 8), torch.arange(6) % 10)
    opts = {o: VALUES[o] for o in metrics.info(name).options}
    res = score(model, data, name, train=data if metrics.info(name).needs_train else None, **opts)
    assert {o: res.options[o] for o in opts} == opts
