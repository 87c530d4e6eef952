"""What a person reading a report sees: the gate's verdict as a coloured badge (PASS, FAIL, NOT GATED) in eval's and
suite's reports, one number format per table column, a sentence instead of a histogram of one repeated value, the
kept epoch ringed on harden's chart (also after one epoch), harden's training CPU time and image counts, and the
verdict sentence at the top of a comparison's (the demo's) report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from robustest import report
from robustest.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")  # two shared cores: one intra-op thread

FAST = ["--version", "custom", "--attacks", "fgsm", "--limit", "40", "--no-progress"]
HARDEN = ["--dataset", "digits", "--limit", "200", "--eps", "0.2", "--epochs", "1", "--steps", "3", "--batch-size",
          "64", "--test-limit", "60", "--whitebox-limit", "30", "--whitebox-pgd-steps", "3", "--whitebox-restarts",
          "1", "--apgd-steps", "3", "--val-steps", "2", "--no-progress"]


def badge(html: str) -> tuple[str, str]:
    """(status class, badge word) of the one verdict badge of a report."""
    found = re.findall(r'<p class="verdict verdict-([a-z-]+)"><span class="badge badge-([a-z-]+)">([A-Z ]+)</span>',
                       html)
    assert len(found) == 1, found
    status, badge_status, word = found[0]
    assert status == badge_status
    return status, word


# ------------------------------------------------------------------------------------------- the badge
@pytest.mark.parametrize("status, word, colour", [("pass", "PASS", "#1a7f37"), ("fail", "FAIL", "#cf222e"),
                                                  ("not-gated", "NOT GATED", "#6e7781")])
def test_verdict_badge_has_its_word_and_colour(status, word, colour):
    html = report.HtmlReport("r").verdict(status, "the gate <said> so").render()
    assert badge(html) == (status, word) and "the gate &lt;said&gt; so" in html
    assert re.search(rf"\.badge-{status}\{{background:{colour}\}}", html)  # a coloured badge, not only a word


def test_an_unknown_verdict_is_refused():
    with pytest.raises(ValueError, match="unknown verdict"):
        report.HtmlReport("r").verdict("passed", "x")


def test_eval_report_badges_pass_fail_and_no_gate(mlp_digits_checkpoint, tmp_path: Path):
    base = ["eval", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--eps", "0.1", *FAST]
    assert main([*base, "--out", str(tmp_path / "none")]) == 0
    assert main([*base, "--fail-under", "0", "--out", str(tmp_path / "pass")]) == 0
    assert main([*base, "--fail-under", "1", "--out", str(tmp_path / "fail")]) == 1
    seen = {d: badge((tmp_path / d / "report.html").read_text()) for d in ("none", "pass", "fail")}
    assert seen == {"none": ("not-gated", "NOT GATED"), "pass": ("pass", "PASS"), "fail": ("fail", "FAIL")}
    html = (tmp_path / "fail" / "report.html").read_text()
    assert "The gate FAILED" in html.split("badge-fail")[-1].split("</p>")[0]
    # FGSM's points all lie on the sphere of radius eps: a sentence, not a one-bar histogram
    assert re.search(r"<p>L-inf norms of the perturbations of the (\d+) broken images: all \1 values equal "
                     r"0\.1000\.</p>", html)


def test_suite_report_badges_pass_fail_and_no_baseline(mlp_digits_checkpoint, tmp_path: Path):
    from robustest import models
    from robustest.models.checkpoints import save_checkpoint

    torch.manual_seed(1)
    untrained = tmp_path / "untrained.pt"
    save_checkpoint(untrained, models.create("mlp", num_classes=10, in_channels=1, input_size=8))
    s = tmp_path / "suite"
    assert main(["suite", "build", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--limit", "100",
                 "--eps", "0.1", "--version", "fast", "--k", "30", "--strata", "2", "--neighbors", "4",
                 "--no-progress", "--out", str(s)]) == 0
    check = ["suite", "check", "--suite", str(s), "--no-progress"]
    assert main([*check, "--checkpoint", mlp_digits_checkpoint, "--out", str(tmp_path / "same")]) == 0
    assert main([*check, "--checkpoint", str(untrained), "--out", str(tmp_path / "worse")]) == 1
    assert main([*check, "--checkpoint", mlp_digits_checkpoint, "--no-baseline", "--out", str(tmp_path / "alone")]) == 0
    seen = {d: badge((tmp_path / d / "report.html").read_text()) for d in ("suite", "same", "worse", "alone")}
    assert seen == {"suite": ("not-gated", "NOT GATED"), "same": ("pass", "PASS"), "worse": ("fail", "FAIL"),
                    "alone": ("not-gated", "NOT GATED")}
    html = (tmp_path / "worse" / "report.html").read_text()
    rows = re.findall(r"<tr><td>candidate</td><td>(?:robust|clean) accuracy</td><td>([^<]*)</td><td>([^<]*)</td>"
                      r"<td>([^<]*)</td></tr>", html)
    assert rows and all(re.fullmatch(r"\d\.\d{3}", v) for row in rows for v in row)  # accuracies: 3 decimals
    drop = re.search(r"<tr><td>robust accuracy</td><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td>", html)
    assert drop and all(re.fullmatch(r"[+-]\d\.\d{3}", v) for v in drop.groups())  # drops: signed, 3 decimals


# ------------------------------------------------------------------------------------------- the columns
def cells(html: str, column: int) -> list[str]:
    return [re.findall(r"<td>([^<]*)</td>", row)[column] for row in re.findall(r"<tr>(.*?)</tr>", html)[1:]]


def test_a_column_of_numbers_has_one_format():
    rows = [{"name": "a", "value": 0.7564, "share": 0.5, "total_s": 12.3, "n": 3, "drop": 0.012},
            {"name": "b", "value": 0.557, "share": 0.12345, "total_s": 0.047, "n": 12, "drop": -0.0077},
            {"name": "c", "value": -0.007715, "share": None, "total_s": 1.0, "n": 7, "drop": float("nan")}]
    html = report.HtmlReport("t").table(rows, kinds={"drop": "signed"}).render()
    assert cells(html, 1) == ["0.7564", "0.5570", "-0.0077"]  # 4 significant digits of the largest, for every row
    assert cells(html, 2) == ["0.500", "0.123", "-"]  # a share: 3 decimals
    assert cells(html, 3) == ["12", "0", "1"]  # seconds: 2 significant digits of the largest
    assert cells(html, 4) == ["3", "12", "7"]  # counts stay whole
    assert cells(html, 5) == ["+0.012", "-0.008", "-"]  # a difference of accuracies: signed
    assert report.column_formatter([1234.5, 0.25], "value")(0.25) == "0"  # no decimals beside 1234.5
    assert report.column_formatter([2.0, 3.0], "passes")(2.0) == "2"
    assert report.column_formatter([torch.tensor(0.25), np.float32(0.5)], "accuracy")(np.float32(0.5)) == "0.500"
    assert report.column_formatter([True, 0.5], "x")(True) == "yes"


# ------------------------------------------------------------------------------------------- histograms
@pytest.mark.parametrize("values, sentence", [
    ([0.3] * 200, "Perturbation norms: all 200 values equal 0.3000."),
    (torch.full((50,), 0.3, dtype=torch.float32).nextafter(torch.tensor(1.0)).tolist() + [0.3] * 10,
     "Perturbation norms: all 60 values equal 0.3000."),  # one float32 ulp apart: still one value
    ({"pool": [2.0, 2.0], "selected": [2.0, float("nan")]}, "Perturbation norms: all 3 values equal 2.0000."),
    ([0.0] * 4, "Perturbation norms: all 4 values equal 0.0000."),
    ([0.3], "Perturbation norms: the one value is 0.3000."),
    ([], "Perturbation norms: no finite value."),
])
def test_a_histogram_of_one_value_is_a_sentence(values, sentence):
    html = report.HtmlReport("h").histogram(values, "perturbation norms", title="norms").render()
    assert f"<p>{sentence}</p>" in html and "<img" not in html


def test_a_histogram_of_spread_values_is_drawn():
    html = report.HtmlReport("h").histogram([0.1, 0.2, 0.3], "perturbation norms", bins=5).render()
    assert "<img" in html and "<figcaption>perturbation norms</figcaption>" in html
    assert report.constant_value([0.1, 0.2]) is None and report.constant_value([1.0, 1.0]) == (2, 1.0)


# ------------------------------------------------------------------------------------------- harden
def test_save_lines_rings_and_labels_a_mark_on_a_one_point_line(monkeypatch):
    import matplotlib.pyplot as plt

    seen = {}
    real = report.figure_png

    def spy(fig):
        ax = fig.axes[0]
        seen["texts"] = [t.get_text() for t in ax.texts]
        seen["lines"] = {ln.get_label(): (ln.get_marker(), ln.get_markerfacecolor(), ln.get_markersize())
                         for ln in ax.get_lines()}
        fig.canvas.draw()
        seen["inside"] = ax.get_window_extent().contains(*ax.transData.transform((100.0, 0.6)))
        return real(fig)

    monkeypatch.setattr(report, "figure_png", spy)
    report.save_lines({"validation PGD accuracy": ([100.0], [0.6])}, None, marks={"kept: epoch 1": (100.0, 0.6)})
    assert seen["texts"] == ["kept: epoch 1"]
    marker, face, size = seen["lines"]["kept: epoch 1"]
    assert marker == "o" and face == "none" and size > seen["lines"]["validation PGD accuracy"][2]  # a ring around it
    assert seen["inside"]
    plt.close("all")


@pytest.mark.parametrize("extra, series", [
    (["--val-size", "20"], "validation PGD accuracy"),
    (["--val-size", "0", "--keep", "last"], "adversarial accuracy (training batches)"),
])
def test_harden_one_epoch_marks_the_kept_epoch_and_records_cpu_time_and_images(
        mlp_digits_checkpoint, tmp_path, monkeypatch, results_contract, capsys, extra, series):
    charts = []
    real = report.save_lines

    def spy(lines, path, **kw):
        charts.append((dict(lines), dict(kw.get("marks") or {})))
        return real(lines, path, **kw)

    monkeypatch.setattr(report, "save_lines", spy)
    out = tmp_path / "h"
    assert main(["harden", "--checkpoint", mlp_digits_checkpoint, *HARDEN, *extra, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "clean accuracy (60 images)" in printed and "PGD accuracy (30 images)" in printed
    assert "CPU-seconds of training" in printed
    res = results_contract(out, "harden")  # docs/schemas/harden.schema.json
    assert res["kept_epoch"] == 1 and len(res["epochs"]) == 1
    assert isinstance(res["training_cpu_s"], float) and res["training_cpu_s"] > 0
    for key in ("before", "after"):
        assert res[key]["num_eval"] == 60 and res[key]["num_whitebox"] == 30
    (lines, marks), = charts
    assert series in lines and list(marks) == ["kept: epoch 1"]
    x, y = marks["kept: epoch 1"]
    assert (x, y) == (lines[series][0][0], lines[series][1][0])  # on the kept epoch's point
    html = (out / "report.html").read_text()
    assert "the kept epoch marked (ringed: epoch 1, model.pt)" in html
    for head in ("clean accuracy (60 images)", "white-box accuracy (30 images)", "APGD-CE accuracy (30 images)"):
        assert f'<th scope="col">{head}</th>' in html
    assert "CPU-seconds of training" in html
    assert json.loads((out / "results.json").read_text())["training_cpu_s"] == res["training_cpu_s"]


# ------------------------------------------------------------------------------------------- the demo's verdict
def _cmp_row(strategy, wb, budget="10%", seeds=3):
    return {"strategy": strategy, "budget": budget, "n": 10, "seeds": seeds, "before_whitebox_accuracy": 0.05,
            "whitebox_accuracy_mean": wb, "whitebox_accuracy_std": 0.01, "fixed_set_accuracy_mean": 0.4}


def _paired(strategy, metric, lo, hi, budget="10%"):
    return {"strategy": strategy, "budget": budget, "metric": metric, "mean_diff": (lo + hi) / 2, "ci_low": lo,
            "ci_high": hi, "n_seeds": 3}


def test_compare_verdict_names_the_most_robust_and_the_comparison_with_random():
    from robustest.robot.report import compare_verdict

    results = {"table": [_cmp_row("best", 0.2), _cmp_row("random", 0.21), _cmp_row("adv-train", 0.61, "online")],
               "paired_vs_random": [_paired("best", "whitebox_accuracy", -0.05, 0.03),
                                    _paired("adv-train", "whitebox_accuracy", 0.3, 0.5),
                                    _paired("adv-train", "clean_accuracy", -0.04, -0.01)]}
    assert compare_verdict(results) == (
        "Verdict: adv-train ends with the highest white-box accuracy, 0.610 ± 0.010 over 3 seeds, from 0.050 for "
        "the original model; paired with random selection by seed (95 % intervals), best is not distinguishable "
        "from random; adv-train is better than random on white-box, but worse on clean.")
    one_seed = {"table": [_cmp_row("best", 0.3, seeds=1), _cmp_row("random", 0.3, seeds=1)],
                "paired_vs_random": [{**_paired("best", "whitebox_accuracy", 0, 0), "ci_low": None, "ci_high": None}]}
    assert compare_verdict(one_seed).startswith("Verdict: best and random end with the highest white-box accuracy")
    assert compare_verdict(one_seed).endswith("with one seed there is no interval for the paired comparison with "
                                              "random selection.")


def test_loop_verdict_says_where_robustness_went_and_why_the_loop_stopped():
    from robustest.robot.report import loop_verdict

    rob = {"clean_accuracy": 0.9, "whitebox_accuracy": 0.3, "fixed_set_accuracy": 0.5}
    results = {"baseline": {**rob, "whitebox_accuracy": 0.1}, "rounds": [{"robustness": rob}],
               "rounds_completed": 1, "stop_reason": "converged"}
    assert loop_verdict(results) == ("Verdict: white-box accuracy went from 0.100 (original model) to 0.300 after "
                                     "1 round; clean accuracy from 0.900 to 0.900; stopped: the median FOL converged.")


def test_compare_report_opens_with_the_verdict(mlp_digits_checkpoint, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("whitebox_pgd_steps: 2\nwhitebox_restarts: 1\napgd_steps: 2\nconvergence_probe: 20\n"
                   "pool_pgd_steps: 3\n")
    out = tmp_path / "cmp"
    assert main(["compare", "--config", str(cfg), "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits",
                 "--train-limit", "200", "--test-limit", "40", "--eps", "0.15", "--epochs", "1", "--whitebox-limit",
                 "20", "--no-progress", "--strategies", "best,random", "--budgets", "10", "--seeds", "0,1",
                 "--out", str(out)]) == 0
    from robustest.robot.report import compare_verdict

    html = (out / "report.html").read_text()
    body = html.split("<body>")[1]
    first = re.search(r"<p class=\"headline\">([^<]*)</p>", body)
    assert first and body.index('class="headline"') < body.index("<p>")  # above everything else but the title
    import html as html_lib

    assert html_lib.unescape(first.group(1)) == compare_verdict(json.loads((out / "results.json").read_text()))
