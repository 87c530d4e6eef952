"""The report of certify (robustest.evaluate.certify_report)."""

from __future__ import annotations

import torch
from torch import nn

from robustest.evaluate.certification import run_certify
from robustest.evaluate.certify_report import certify_report
from robustest.results import document


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))


def _data():
    torch.manual_seed(1)
    x = torch.rand(10, 1, 4, 4)
    with torch.no_grad():
        y = _model()(x).argmax(1)  # every image classified correctly
    return x, y


def _report(method: str, eps: float, **kw) -> str:
    x, y = _data()
    res = run_certify(_model(), (x, y), eps, method=method, **kw)
    doc = document("certify", {}, {**res.to_results(), "data": {"dataset": "toy"}}, {"total_s": 1.0}, world_size=1)
    return certify_report(res, doc, (x, y)).render(), res


def test_a_bound_certificate_reports_its_lower_margins_and_the_images_it_misses():
    html, res = _report("ibp", 0.5)
    assert "robustest certify: toy, ibp, linf eps=0.5" in html and "lower margin bounds" in html
    assert "IBP proves, per sample" in html
    assert ("Not certified" in html) == bool((res.clean_correct & ~res.certified).any())


def test_smoothing_says_it_certifies_the_smoothed_classifier():
    html, _ = _report("smoothing", 0.1, norm="l2", sigma=0.25, n0=20, n=50)
    assert "certifies the smoothed classifier" in html and "smoothed accuracy" in html and "certified radii" in html
