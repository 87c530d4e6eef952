"""The suite reports' per-stratum rows and pages (robustest.suite.report), on a small hand-made suite."""

from __future__ import annotations

import pytest
import torch

from robustest.results import document
from robustest.suite.report import build_report, check_report, stratum_rows
from suite.test_reading import make_suite


def test_stratum_rows_are_the_shares_of_each_stratum_exactly():
    s = make_suite(k=4)  # strata [0, 0, 1, 1]
    s.score = torch.tensor([0.25, 0.75, 0.5, 1.0])
    cand = {"robust": torch.tensor([True, False, True, True])}
    base = {"robust": torch.tensor([True, True, False, False])}
    rows = stratum_rows(s, cand, base)
    assert rows == [
        {"stratum": 0, "score bin": 0, "class": "all", "N_h": 10, "weight": 0.5, "samples": 2, "robust": 0.5,
         "baseline robust": 1.0, "mean score": pytest.approx(0.5)},
        {"stratum": 1, "score bin": 1, "class": "all", "N_h": 10, "weight": 0.5, "samples": 2, "robust": 1.0,
         "baseline robust": 0.0, "mean score": pytest.approx(0.75)},
    ]
    assert "baseline robust" not in stratum_rows(s, cand)[0]


def test_a_stratum_without_samples_has_no_mean_score_and_a_class_cell_names_its_class():
    s = make_suite(k=4)
    s.stratum = torch.zeros(4, dtype=torch.long)  # stratum 1 drew nothing
    s.meta["strata"]["cells"][1]["class"] = 3
    rows = stratum_rows(s, {"robust": torch.ones(4, dtype=torch.bool)})
    assert rows[1]["samples"] == 0 and rows[1]["mean score"] is None and rows[1]["class"] == 3


def test_the_build_report_gates_nothing():
    s = make_suite(k=4)
    doc = document("suite", {"command": "build"}, {"command": "build"}, {"total_s": 1.0}, world_size=1)
    html = build_report(s, doc).render()
    assert "gates nothing" in html and "4 of the 20 samples" in html


def test_the_check_report_states_the_verdict_and_the_changed_samples():
    from types import SimpleNamespace

    from robustest.suite.stats import Estimate

    s = make_suite(k=4)
    e = Estimate(0.5, 0.1, 0.9, 0.2, 4.0, 2, 0.95)
    res = SimpleNamespace(verdict="regression", message=lambda: "regression: robust accuracy dropped", alpha=0.05,
                          max_drop=0.01, robust=e, clean=e, corruption=None, certified=None, baseline={},
                          baseline_source="suite", comparison=None, outcomes={"robust": torch.tensor([0, 1, 1, 1])},
                          baseline_outcomes={"robust": torch.tensor([1, 1, 1, 0])})
    suite_doc = {"k": 4, "n_population": 20, "strata": 2, "attack": s.meta["attack"]}
    doc = document("suite", {"command": "check"}, {"suite": suite_doc, "strata": stratum_rows(s, res.outcomes)},
                   {"total_s": 1.0}, world_size=1)
    html = check_report(res, doc, s).render()
    assert "regression: robust accuracy dropped" in html and 'verdict-fail' in html
    assert "1 broken by the candidate only, 1 kept robust by the candidate only" in html
