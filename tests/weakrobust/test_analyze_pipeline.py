"""The analyze pipeline (robustest.weakrobust.analyze_pipeline): saved steps, the radius, the results."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import spearmanr

from robustest import weakrobust as wr
from robustest.core.batching import take
from robustest.report import format_value
from robustest.weakrobust.analyze_pipeline import AnalysisOptions, analyze_pipeline, resumable_analysis


@pytest.fixture
def data(digits_train):
    return take(digits_train, torch.arange(50))


def test_the_steps_do_not_change_the_scores_and_a_rerun_reuses_them(tmp_path, trained_digits_model, data):
    whole = wr.analyze(trained_digits_model, data, n_neighbors=6, eps=0.3, seed=2)
    notes: list[str] = []
    opts = AnalysisOptions(neighbors=6, eps=0.3, seed=2, save_every=16)
    stepped = resumable_analysis(trained_digits_model, data, tmp_path, opts, progress=False, note=notes.append)
    assert torch.equal(stepped.score, whole.score) and torch.equal(stepped.label, whole.label)
    assert notes == []
    again = resumable_analysis(trained_digits_model, data, tmp_path, opts, progress=False, note=notes.append)
    assert torch.equal(again.score, whole.score) and notes[-1] == "4 finished step(s) of an interrupted run reused"


def test_analyze_pipeline_saves_the_analysis_and_the_radius_figures(tmp_path, trained_digits_model, data):
    run = analyze_pipeline(trained_digits_model, data, out=tmp_path, options=AnalysisOptions(neighbors=6, eps=0.3),
                           radius_eps_max=0.3, progress=False)
    assert torch.equal(wr.Analysis.load(tmp_path / "analysis.pt").score, run.analysis.score)
    radius = torch.load(tmp_path / "radius.pt", weights_only=True)
    assert torch.equal(radius, run.radius) and radius.shape == (50,)
    fin = radius[torch.isfinite(radius)]
    rho = spearmanr(run.analysis.score.numpy(), (-radius.clamp(max=0.6)).numpy()).statistic
    assert run.radius_figures == {"eps_max": 0.3, "median": float(fin.median()),
                                  "frac_not_flipped": float((~torch.isfinite(radius)).float().mean()),
                                  "spearman_score_vs_minus_radius": float(rho)}
    res = run.to_results()
    assert list(res) == ["n", "summary", "weakest", "files", "radius", "peak_rss_mib"] and res["n"] == 50
    assert res["files"] == {"analysis": "analysis.pt", "report": "report.html", "radius": "radius.pt"}
    assert set(run.timings) == {"analyze_s", "radius_s"}
    s = run.analysis.summary()
    assert run.summary_line() == (
        f"analysed 50 samples in {format_value(run.analysis.params['seconds'], 'analyze_s')} s: clean accuracy "
        f"{format_value(s['clean_accuracy'], 'accuracy')}, mean score {format_value(s['mean_score'])}, "
        f"{format_value(100 * s['frac_most_neighbours_wrong'])} % with most neighbours misclassified")
    plain = analyze_pipeline(trained_digits_model, data, out=tmp_path / "p", options=AnalysisOptions(neighbors=6),
                             progress=False)
    assert plain.radius is None and "radius" not in plain.to_results() and set(plain.timings) == {"analyze_s"}


def test_analysis_options_record_the_settings_in_effect():
    assert AnalysisOptions().settings() == {"neighbors": 50, "eps": 0.22, "noise": "uniform", "quantize": True}
    o = AnalysisOptions(neighbors=5, eps=0.1, noise="gaussian", no_quantize=True, batch_size=64, amp="bf16")
    assert o.settings(batch_size_auto=True) == {"neighbors": 5, "eps": 0.1, "noise": "gaussian", "quantize": False,
                                                "batch_size": 64, "batch_size_auto": True, "amp": "bf16"}
    assert list(o.settings()) == ["neighbors", "eps", "noise", "quantize", "batch_size", "amp"]
