"""The eval pipeline from Python (robustest.evaluate.eval_pipeline, eval_report): what ``robustest eval`` runs."""

from __future__ import annotations

import csv

import pytest
import torch
from torch import nn

from robustest import data
from robustest.core.errors import ConfigError
from robustest.evaluate.eval_pipeline import eval_pipeline
from robustest.evaluate.eval_report import eval_report, sample_rows
from robustest.results import document


def Fixed() -> nn.Module:  # noqa: N802 - reads as the model's name
    """Logits 10 * (m, 1 - m) of the image's mean m, as a linear layer IBP can bound: with labels from the same rule
    it is right on every image not at m = 0.5."""
    lin = nn.Linear(64, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.stack([torch.full((64,), 10 / 64), torch.full((64,), -10 / 64)]))
        lin.bias.copy_(torch.tensor([0.0, 10.0]))
    return nn.Sequential(nn.Flatten(), lin)


@pytest.fixture(scope="module")
def digits():
    x, _ = data.load("digits", split="test", limit=24).tensors
    y = (x.flatten(1).mean(1) < 0.5).long()
    return x, y


OPTS = {"version": "fast", "n_targets": 1, "seed": 0, "progress": False}


def test_the_gate_passes_at_the_robust_accuracy_and_fails_above_it(digits, tmp_path):
    run = eval_pipeline(Fixed(), digits, 0.05, out=tmp_path / "a", fail_under=0.0, **OPTS)
    acc = run.result.robust_accuracy
    assert run.passed is True and run.gate == {"fail_under": 0.0, "passed": True, "accuracy_passed": True,
                                               "accepted_flags": [], "blocking_flags": []}
    at = eval_pipeline(Fixed(), digits, 0.05, out=tmp_path / "b", fail_under=acc, **OPTS)
    assert at.passed is (not at.blocking)  # robust accuracy >= fail_under: passes unless a flag blocks it
    above = eval_pipeline(Fixed(), digits, 0.05, out=tmp_path / "c", fail_under=min(acc + 0.01, 1.0), **OPTS)
    if acc < 1.0:
        assert above.passed is False and above.gate["accuracy_passed"] is False
    assert eval_pipeline(Fixed(), digits, 0.05, out=tmp_path / "d", **OPTS).passed is None  # no gate


def test_the_pipeline_writes_samples_and_adversarials_and_records_the_description(digits, tmp_path):
    run = eval_pipeline(Fixed(), digits, 0.05, out=tmp_path, save_adv=True, certify="ibp",
                        describe={"dataset": "digits", "name": "fixed", "model": {"model": "m:f"},
                                  "data": {"dataset": "digits"}}, **OPTS)
    assert run.files == ["results.json", "samples.csv", "report.html", "adv.pt"]
    rows = list(csv.DictReader((tmp_path / "samples.csv").open()))
    assert len(rows) == 24 and {r["bracket"] for r in rows} <= {"certified", "undecided", "broken_by_attack",
                                                                 "misclassified", "unsound"}
    res = run.to_results()
    assert res["data"] == {"dataset": "digits", "num_samples": 24} and res["model"] == {"model": "m:f"}
    assert res["robustbench"]["name"] == "fixed" and "bracket" in res and "gate" not in res
    assert "timings" not in res and "settings" not in res and "attack_settings" in res
    assert list(res)[-2:] == ["peak_rss_mib", "files"] and res["files"] == run.files and res["peak_rss_mib"] > 0
    assert torch.load(tmp_path / "adv.pt", weights_only=True)["x"].shape == digits[0].shape


def test_a_refused_argument_writes_nothing(digits, tmp_path):
    with pytest.raises(ConfigError):
        eval_pipeline(Fixed(), digits, 0.05, out=tmp_path / "never", version="fast", n_targets=5)
    assert not (tmp_path / "never").exists()


def test_sample_rows_carry_the_bracket_and_the_report_states_the_verdict(digits, tmp_path):
    run = eval_pipeline(Fixed(), digits, 0.05, out=tmp_path, certify="ibp", fail_under=1.0, **OPTS)
    rows = sample_rows(run.result, run.bracket)
    assert [r["bracket"] for r in rows] == run.bracket.labels
    assert sample_rows(run.result, None) == run.result.rows()
    doc = document("eval", {"dataset": "digits"}, run.to_results(), {"total_s": 1.0}, world_size=1)
    text = eval_report(run.result, doc, run.bracket, digits).render()
    verdict = "The gate passed" if run.passed else "The gate FAILED"
    assert verdict in text and "Certified, robust and clean accuracy" in text


def test_gate_lines_and_failed_say_why_a_run_fails(digits, tmp_path):
    import dataclasses

    from robustest.evaluate.certification import Bracket

    run = eval_pipeline(Fixed(), digits, 0.2, out=tmp_path, fail_under=0.0, **OPTS)
    assert run.failed is False and run.gate_lines() == []
    acc = run.result.robust_accuracy
    assert 0 < acc < 1
    low = dataclasses.replace(run, gate={**run.gate, "fail_under": 1.0, "passed": False})
    assert low.failed is True
    assert low.gate_lines() == [f"robust accuracy {acc:.4f} is below --fail-under 1.0000"]
    unsound = Bracket.from_outcomes([True, True, False], [True, False, False], [True, True, True])
    lines = dataclasses.replace(run, bracket=unsound, gate=None).gate_lines()
    assert lines == ["SOUNDNESS ERROR: 1 samples are both certified and broken (samples.csv: bracket = unsound); "
                     "the figures cannot be trusted"]
    assert dataclasses.replace(run, bracket=unsound, gate=None).failed is True  # no gate: unsound fails
    assert dataclasses.replace(run, bracket=unsound).failed is False  # a passed gate decides


def test_summary_lines_state_the_figures_the_verb_prints(digits, tmp_path):
    import dataclasses

    from robustest.evaluate.certification import Bracket

    run = eval_pipeline(Fixed(), digits, 0.05, out=tmp_path, describe={"dataset": "digits"}, **OPTS)
    r = run.result
    per = ", ".join(f"{k} {100 * v:.2f}%" for k, v in r.attacks.items())
    main_line = (f"digits (24 images), linf eps=0.05, fast: clean {100 * r.clean_accuracy:.2f}%, robust "
                 f"{100 * r.robust_accuracy:.2f}% ({per})")
    assert run.summary_lines() == ([main_line], [])
    escalated = dataclasses.replace(run, result=dataclasses.replace(r, version="auto", plan="rand"),
                                    describe={})
    assert escalated.summary_lines()[0][0].startswith("custom (24 images), linf eps=0.05, auto -> rand: clean ")
    curve = [{"eps": 0.1, "robust_accuracy": 0.5, "broke": 3, "attacked": 8},
             {"eps": 0.25, "robust_accuracy": 0.125, "broke": 2, "attacked": 4}]
    corr = {"mce": 0.5, "mean_corruption_accuracy": 0.75}
    brk = Bracket.from_outcomes([True, False, False, False], [False, True, False, False], [True, True, True, False],
                                method="crown")
    lines = dataclasses.replace(run, result=dataclasses.replace(r, curve=curve, corruption=corr), bracket=brk)
    before, after = lines.summary_lines()
    assert before[:2] == ["eps=0.1: robust 50.00% (3 of 8 broken at this radius)",
                          "eps=0.25: robust 12.50% (2 of 4 broken at this radius)"] and len(before) == 3
    assert after == ["corruptions: mean accuracy 75.00%, mCE 50.00% of the baseline's",
                     "bracket (crown): certified 25.00% <= robust 50.00% <= clean 75.00% (1 undecided)"]
    no_base = dataclasses.replace(run, result=dataclasses.replace(r, corruption={**corr, "mce": None}))
    assert no_base.summary_lines()[1] == ["corruptions: mean accuracy 75.00%"]
    fixed = dataclasses.replace(r, clean_accuracy=0.875, robust_accuracy=0.25, attacks={"apgd-ce": 0.5, "apgd-t": 0.25})
    assert dataclasses.replace(run, result=fixed).summary_lines()[0] == [
        "digits (24 images), linf eps=0.05, fast: clean 87.50%, robust 25.00% (apgd-ce 50.00%, apgd-t 25.00%)"]


def test_settings_record_the_evaluation_as_run_and_each_option_given(digits, tmp_path):
    run = eval_pipeline(Fixed(), digits, 0.05, out=tmp_path / "a", **OPTS)
    assert run.settings() == {"eps": 0.05, "norm": "linf", "version": "fast", "batch_size": 256, "block_size": 4096,
                              "seed": 0, "device": "cpu", "n_targets": 1}
    preprocessed = nn.Sequential(nn.Identity(), Fixed())  # a submodule of the input's shape, for BPDA
    full = eval_pipeline(preprocessed, digits, [0.02, 0.05], out=tmp_path / "b", version="custom", attacks=["apgd-ce"],
                         seed=3, batch_size=8, block_size=16, fail_under=0.1, certify="ibp", save_adv=True,
                         accept_flags=["zero-gradient"], corruptions="gaussian_noise", severities=[2], forwards=1,
                         amp="bf16", bpda="0", progress=False)
    s = full.settings(batch_size_auto=True, baseline="b.pt", surrogate="s.pt")
    assert s == {"eps": [0.02, 0.05], "norm": "linf", "version": "custom", "batch_size": 8, "block_size": 16,
                 "seed": 3, "device": "cpu", "batch_size_auto": True, "attacks": ["apgd-ce"], "fail_under": 0.1,
                 "baseline": "b.pt", "amp": "bf16", "bpda": "0", "surrogate": "s.pt", "forwards": 1, "certify": "ibp",
                 "corruptions": "gaussian_noise", "severities": [2], "save_adv": True,
                 "accept_flag": ["zero-gradient"]}
    assert list(s)[:8] == ["eps", "norm", "version", "batch_size", "block_size", "seed", "device", "batch_size_auto"]


def test_the_flags_accepted_are_the_ones_that_stop_blocking(digits, tmp_path):
    import dataclasses

    from robustest.evaluate.flags import Flag

    run = eval_pipeline(Fixed(), digits, 0.05, out=tmp_path, **OPTS)
    zero = Flag("zero-gradient", "unreliable", "no gradient", "use an adaptive attack")
    flagged = dataclasses.replace(run, result=dataclasses.replace(run.result, flags=[zero]))
    assert flagged.blocking == [zero]
    accepted = dataclasses.replace(flagged, request={**run.request, "accept_flags": ["zero-gradient"]})
    assert accepted.blocking == [] and accepted.settings()["accept_flag"] == ["zero-gradient"]
    assert "accept_flag" not in run.describe and "accept_flag" not in run.settings()

