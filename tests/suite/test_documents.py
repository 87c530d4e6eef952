"""The results of suite build and suite check (robustest.suite.documents)."""

from __future__ import annotations

from robustest.suite.documents import SUITE_FILE, build_results, check_results
from suite.test_reading import make_suite
from suite.test_rules import a_check


def test_build_results_describe_the_suite():
    s = make_suite(k=4)
    d = build_results(s)
    assert d["command"] == "build" and d["files"] == [SUITE_FILE, "results.json", "report.html"]
    assert d["suite"] == {"file": "suite.pt", "k": 4, "n_population": 20, "strata": 2, "by_class": False,
                          "stratum_sizes": [10, 10], "stratum_samples": [2, 2], "stratum_weights": [0.5, 0.5],
                          "data_sha256": s.meta["data_sha256"], "baseline_sha256": s.meta["baseline_sha256"],
                          "attack": s.meta["attack"], "corruption_settings": 0}
    assert d["baseline"] is s.meta["baseline"]
    s.meta["certify"] = {"method": "ibp"}
    assert build_results(s)["suite"]["certify"] == "ibp"


def test_check_results_carry_the_verdict_the_suite_and_its_strata():
    s = make_suite(k=4)
    res = a_check(True)
    res.outcomes = {"clean": s.clean, "robust": s.robust}
    d = check_results(res, s)
    assert d["command"] == "check" and d["verdict"] == "regression" and d["message"] == res.message()
    assert d["suite"]["attack"] == {**s.meta["attack"], "version": "fast"} and d["suite"]["dataset"] == "digits"
    assert [r["samples"] for r in d["strata"]] == [2, 2] and d["files"] == ["results.json", "report.html"]
    assert "certify" not in d["suite"]
