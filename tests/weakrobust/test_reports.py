"""The reports of analyze and validate (robustest.weakrobust.reports)."""

from __future__ import annotations

import torch
from torch import nn

from robustest import weakrobust as wr
from robustest.report import HtmlReport
from robustest.results import document
from robustest.weakrobust.reports import (
    analysis_report,
    analyze_report,
    validation_report,
    validation_rows,
    weakest_grid,
    weakest_rows,
)


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    x = torch.rand(12, 1, 4, 4)
    y = torch.randint(0, 3, (12,))
    analysis = wr.analyze(model, (x, y), n_neighbors=4, eps=0.2, seed=0)
    return model, (x, y), analysis


def test_weakest_rows_follow_the_analysis_order_exactly():
    _, _, analysis = _setup()
    rows = weakest_rows(analysis, n=3)
    order = analysis.order()[:3].tolist()
    assert [r["index"] for r in rows] == [int(analysis.index[p]) for p in order]
    assert [r["score"] for r in rows] == [float(analysis.score[p]) for p in order]
    assert len(weakest_rows(analysis, n=100)) == 12


def test_the_analysis_section_and_the_grid_are_drawn():
    _, data, analysis = _setup()
    assert weakest_grid(data, analysis, torch.tensor([0, 1]), "two")[:4] == b"\x89PNG"
    rep = HtmlReport("t")
    analysis_report(rep, data, analysis, 4)
    html = rep.render()
    assert "Local robustness" in html and "Weakest samples: y = label" in html


def test_the_analyze_report_states_the_neighbourhood_and_the_radius():
    _, data, analysis = _setup()
    settings = {"dataset": "toy", "split": "test", "neighbors": 4, "eps": 0.2, "noise": "uniform", "quantize": True}
    radius = torch.tensor([0.1] * 11 + [float("inf")])
    doc = document("analyze", settings, {"weakest": weakest_rows(analysis, 2), "radius": {"eps_max": 0.2}},
                   {"total_s": 1.0}, world_size=1)
    html = analyze_report(doc, data, analysis, radius, 4).render()
    assert "robustest analyze: toy test" in html
    assert "12 samples, 4 neighbours each, eps 0.2 (uniform noise, quantised)" in html
    assert "Adversarial radius" in html
    assert "Adversarial radius" not in analyze_report(doc, data, analysis, None, 4).render()


def test_validation_rows_pair_the_weak_set_and_the_test_split():
    model, data, analysis = _setup()
    weak = wr.select_weak(analysis, k=4)
    res = wr.validate(model, data, weak, perturbations="fgsm", eps=(0.1,), seed=0)
    test = wr.validate(model, data, None, perturbations="fgsm", eps=(0.1,), seed=0)
    rows = validation_rows(res, test)
    per = res.summary()["per_type"]
    assert [r["type"] for r in rows] == list(per)
    assert [r["weak_error"] for r in rows] == [d["error"] for d in per.values()]
    assert [r["test_error"] for r in rows] == [test.per_type()[t][1] for t in per]
    assert all(r["test_error"] is None for r in validation_rows(res, None))
    doc = document("validate", {}, {}, {"total_s": 1.0}, world_size=1)
    html = validation_report(doc, "toy", "test", data, analysis, weak, res, test, rows).render()
    assert "robustest validate: toy" in html and "4 of 12 test samples" in html
