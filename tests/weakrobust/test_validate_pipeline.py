"""The validate pipeline (robustest.weakrobust.validate_pipeline): the weak set, its validation and the files."""

from __future__ import annotations

import pytest
import torch

from robustest import weakrobust as wr
from robustest.core.batching import take
from robustest.core.errors import DataError
from robustest.report import format_value
from robustest.weakrobust.validate_pipeline import ITERATIVE_ATTACKS, check_analysis_of, validate_pipeline


@pytest.fixture
def setup(trained_digits_model, digits_train):
    data = take(digits_train, torch.arange(60))
    analysis = wr.analyze(trained_digits_model, data, n_neighbors=8, eps=0.4, seed=0)
    return trained_digits_model, data, analysis


def test_check_analysis_of_refuses_an_analysis_of_other_samples(setup):
    _, data, analysis = setup
    assert check_analysis_of(analysis, data, "a.pt") is analysis
    with pytest.raises(DataError, match="^a.pt analyses 60 samples but --dataset d has 59 "):
        check_analysis_of(analysis, take(data, torch.arange(59)), "a.pt", "--dataset d")
    other = (data[0], (data[1] + 1) % 10)
    with pytest.raises(DataError, match="the data has 60 \\(or other labels\\)"):
        check_analysis_of(analysis, other, "a.pt")


def test_validate_pipeline_saves_the_set_and_measures_it_and_the_test_samples(tmp_path, setup, digits_test):
    model, data, analysis = setup
    run = validate_pipeline(model, data, analysis, out=tmp_path, test=digits_test, test_limit=20,
                            select={"k": 10, "strategy": "weak"}, perturbations=["fgsm", "pgd", "gaussian_noise"],
                            eps=[0.1], severities=(2,), attack_steps=3, seed=1, progress=False, analysis_s=2.0)
    expected = wr.select_weak(analysis, k=10, strategy="weak", seed=1)
    assert torch.equal(run.weak.indices, expected.indices) and len(run.weak) == 10
    assert wr.WeakSet.load(tmp_path / "weakset.pt").indices.tolist() == expected.indices.tolist()
    assert (tmp_path / "weakset.json").is_file() and (tmp_path / "validation.pt").is_file()
    assert run.result.meta["attacks"] == ["fgsm", "pgd"] and run.result.meta["corruptions"] == ["gaussian_noise"]
    assert run.test_result is not None and run.test_result.indices.tolist() == list(range(20))
    assert [r["type"] for r in run.rows] == ["clean", "fgsm", "pgd", "gaussian_noise"]
    assert run.timings["analysis_s"] == 2.0 and set(run.timings) == {"analysis_s", "validate_weak_s",
                                                                     "validate_test_s"}
    res = run.to_results()
    assert res["n_analysed"] == 60 and res["weak_set"]["indices"] == expected.indices.tolist()
    assert res["weaknesses"] == run.result.weaknesses() and res["table"] is run.rows
    assert res["files"] == {"weak_set": "weakset.pt", "weak_set_json": "weakset.json", "validation": "validation.pt",
                            "report": "report.html"}
    assert run.settings == {"strategy": "weak", "k": 10, "per_class": False, "correct_only": False,
                            "perturbations": ["fgsm", "pgd", "gaussian_noise"], "attack_eps": [0.1],
                            "attack_steps": 3, "severities": [2], "test_limit": 20, "seed": 1, "device": "cpu"}
    again = validate_pipeline(model, data, analysis, out=tmp_path, select={"k": 10, "strategy": "weak"},
                              perturbations=["pgd"], eps=[0.1], attack_steps=3, seed=1, progress=False)
    assert again.test_result is None and again.to_results()["test"] is None  # no test data, no comparison
    assert "severities" not in again.settings and again.settings["perturbations"] == ["pgd"]
    res_ = run.result
    assert run.summary_line() == (f"weak set: 10 samples; mean adversarial error "
                                  f"{format_value(res_.mean_adv_error, 'error')}, mCE {format_value(res_.mce, 'mce')}; "
                                  f"weaknesses: {', '.join(res_.weaknesses()) or 'none'}")
    assert ITERATIVE_ATTACKS == ("pgd", "bim", "mifgsm", "rfgsm")


def test_an_empty_weak_set_is_refused(tmp_path, setup):
    model, data, _ = setup
    calm = wr.analyze(model, data, n_neighbors=8, eps=0.01, seed=0)  # no correct sample has a neighbour wrong
    with pytest.raises(DataError, match="the weak set is empty"):
        validate_pipeline(model, data, calm, out=tmp_path / "v", select={"threshold": 0.5, "strategy": "weak-correct"},
                          progress=False)
    assert not (tmp_path / "v").exists()  # refused before the folder is made


def test_the_settings_name_the_strata_of_a_stratified_set_and_the_weak_correct_rule(tmp_path, setup):
    model, data, analysis = setup
    run = validate_pipeline(model, data, analysis, out=tmp_path, select={"k": 12, "strategy": "stratified",
                                                                         "strata": 3, "allocation": "neyman"},
                            perturbations=["gaussian_noise"], severities=(1, 3), seed=2, progress=False)
    assert run.settings == {"strategy": "stratified", "strata": 3, "allocation": "neyman", "k": 12,
                            "per_class": False, "correct_only": False, "perturbations": ["gaussian_noise"],
                            "severities": [1, 3], "test_limit": 0, "seed": 2, "device": "cpu"}
    weak = validate_pipeline(model, data, analysis, out=tmp_path / "w", select={"k": 5, "strategy": "weak-correct",
                                                                               "per_class": True},
                             perturbations=["fgsm"], eps=[0.2], attack_steps=None, progress=False)
    s = weak.settings
    assert (s["strategy"], s["correct_only"], s["per_class"], s["attack_eps"]) == ("weak-correct", True, True, [0.2])
    assert "attack_steps" not in s and "strata" not in s and "severities" not in s
    plain = validate_pipeline(model, data, analysis, out=tmp_path / "p", select={"fraction": 0.25,
                                                                                "strategy": "stratified"},
                              perturbations=["gaussian_noise", "fgsm"], eps=[0.1], severities=(5,), progress=False)
    s = plain.settings  # the selection options not given: select_weak's defaults
    assert (s["strata"], s["allocation"], s["per_class"], s["fraction"]) == (10, "proportional", False, 0.25)
    assert "k" not in s and s["perturbations"] == ["fgsm", "gaussian_noise"] and s["severities"] == [5]
    by_threshold = validate_pipeline(model, data, analysis, out=tmp_path / "t", select={"threshold": 0.25,
                                                                                       "strategy": "weak"},
                                     perturbations=["fgsm"], eps=[0.1], progress=False)
    s = by_threshold.settings
    assert s["threshold"] == 0.25 and "k" not in s and "fraction" not in s
