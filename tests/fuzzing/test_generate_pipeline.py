"""The generate pipeline (robustest.fuzzing.generate_pipeline): the tests file, its FOL, summary and results."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from robustest import data as datasets
from robustest.core.batching import take
from robustest.core.errors import ConfigError
from robustest.fuzzing.generate import GenerateOptions
from robustest.fuzzing.generate_pipeline import generate_pipeline
from robustest.metrics.loss import fol
from robustest.report import format_value

SOURCE = {"dataset": "digits", "split": "test", "checkpoint": "m.pt"}


@pytest.fixture
def seeds(digits_test):
    return take(digits_test, torch.arange(12))


def test_generate_pipeline_writes_the_tests_with_their_fol(tmp_path, trained_digits_model, seeds):
    opts = GenerateOptions(method="pgd", steps=5, keep_all=True)
    run = generate_pipeline(opts, trained_digits_model, seeds, out=tmp_path, eps=0.2, source=SOURCE, seed=3,
                            progress=False, load_s=1.0)
    t = datasets.load_tests(tmp_path / "tests.pt")
    assert t["x"].shape[0] == run.num_tests == 12 and t["x0_index"].tolist() == list(range(12))  # keep_all: every one
    assert t["method"] == "pgd" and t["extra"]["dataset"] == "digits" and t["extra"]["eps"] == 0.2
    assert (run.fol_norm, run.fol_eps) == ("linf", 0.2) and torch.equal(t["fol"], run.fol)
    want = fol(trained_digits_model, t["x"], t["y"], x0=seeds[0], eps=0.2, norm="linf")
    assert torch.allclose(run.fol, want, atol=1e-5)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["seeds"] == 12 and summary["checkpoint"] == "m.pt" and summary["seed"] == 3
    assert summary["files"] == ["tests.pt", "summary.json", "results.json", "report.html", "examples.png",
                                "fol_hist.png"]
    assert run.timings["total_s"] >= 1.0 + run.timings["generate_s"]
    res = run.to_results()
    assert not {"seed", "method", "dataset", "split", "checkpoint", "params", "files"} & set(res) - {"files"}
    assert res["files"] == {"tests": "tests.pt", "report": "report.html", "summary": "summary.json",
                            "examples": "examples.png", "histogram": "fol_hist.png"}
    assert res["device"] == "cpu" and run.grid is not None
    rate = format_value(summary["success_rate"], "success_rate")
    assert run.summary_line(2.5) == f"pgd on 12 digits/test seeds: 12 tests, success rate {rate} (2.5 s)"
    assert run.summary_line().endswith(f"({format_value(run.timings['total_s'], 'total_s')} s)")
    no_rate = dataclasses.replace(run, summary={**run.summary, "success_rate": None})
    assert no_rate.summary_line(2.5) == "pgd on 12 digits/test seeds: 12 tests (2.5 s)"


def test_generate_pipeline_refuses_no_seeds_and_keep_all_with_a_fuzzer(tmp_path, trained_digits_model, seeds):
    with pytest.raises(ConfigError, match="the test split of digits is empty"):
        generate_pipeline(GenerateOptions(method="pgd"), trained_digits_model, take(seeds, torch.arange(0)),
                          out=tmp_path, eps=0.2, source=SOURCE, progress=False)
    with pytest.raises(ConfigError, match="--keep-all applies to attacks; fol-fuzz only returns failing tests"):
        generate_pipeline(GenerateOptions(method="fol-fuzz", keep_all=True), trained_digits_model, seeds,
                          out=tmp_path, eps=0.2, source=SOURCE, progress=False)
    assert not (tmp_path / "tests.pt").exists()


def test_the_settings_in_effect_are_the_resolved_parameters_of_the_method():
    from robustest.fuzzing.generate_pipeline import settings_in_effect

    pgd = GenerateOptions(method="pgd", keep_all=True, batch_size=64)
    assert settings_in_effect(pgd, {"eps": 0.1, "alpha": None, "steps": 10}, "linf", 0.1, grid=8, seed=3,
                              device="cpu") == {
        "method": "pgd", "eps": 0.1, "steps": 10, "keep_all": True, "fol_norm": "linf", "fol_eps": 0.1,
        "batch_size": 64, "grid": 8, "seed": 3, "device": "cpu"}
    fol = GenerateOptions(method="fol-fuzz", fuzz_eps=0.2)
    got = settings_in_effect(fol, {"steps": 40, "lr": 0.1, "eps": 0.2, "time_budget": None}, "l2", 1.5, grid=4,
                             seed=0, device="cpu")
    assert got == {"method": "fol-fuzz", "steps": 40, "lr": 0.1, "fuzz_eps": 0.2, "fol_norm": "l2", "fol_eps": 1.5,
                   "batch_size": 256, "grid": 4, "seed": 0, "device": "cpu"}  # a fuzzer keeps no keep_all
    cov = GenerateOptions(method="cov-fuzz", profile_limit=50)
    got = settings_in_effect(cov, {"coverage": "kmnc", "metric_opts": {"k": 5}, "iterations": 10,
                                   "profile_images": 50}, "linf", 0.3, grid=8, seed=1, device="cpu")
    assert got == {"method": "cov-fuzz", "coverage": "kmnc", "iterations": 10, "k": 5, "profile_limit": 50,
                   "fol_norm": "linf", "fol_eps": 0.3, "batch_size": 256, "grid": 8, "seed": 1, "device": "cpu"}
    assert "profile_limit" not in settings_in_effect(GenerateOptions(method="cov-fuzz"), {}, "linf", 0.3, grid=8,
                                                     seed=1, device="cpu")
