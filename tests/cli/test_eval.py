"""Tests of the ``robustest eval`` verb: outputs, the --fail-under gate and bad input."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from robustest.cli import main
from robustest.cli.args import radius
from robustest.cli.eval import parse_accuracy

FAST = ["--version", "custom", "--attacks", "fgsm,bim", "--limit", "40", "--no-progress"]


pytestmark = pytest.mark.usefixtures("one_thread")  # two shared cores: one intra-op thread


def test_parsers():
    assert radius("8/255") == pytest.approx(8 / 255) and radius("0.3") == 0.3
    assert parse_accuracy("85%") == pytest.approx(0.85) and parse_accuracy("0.5") == 0.5
    import argparse

    for bad in ("x", "1/0", "nan", "1e400"):
        with pytest.raises(argparse.ArgumentTypeError):
            radius(bad)
    for bad in ("1.5", "-1", "120%", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_accuracy(bad)


def test_outputs(mlp_digits_checkpoint, tmp_path: Path, capsys):
    out = tmp_path / "ev"
    rc = main(["eval", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--eps", "0.1", *FAST,
               "--out", str(out), "--save-adv", "--seed", "2"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "robust" in printed and "wrote results.json, samples.csv, report.html, adv.pt" in printed
    doc = json.loads((out / "results.json").read_text())
    assert doc["format"] == "robustest-eval-results" and doc["version"] == 1 and doc["world_size"] == 1
    assert doc["num_samples"] == 40 and doc["data"]["dataset"] == "digits" and doc["data"]["num_samples"] == 40
    assert list(doc["attacks"])[:2] == ["fgsm", "bim"] and set(doc["attacks"]) <= {"fgsm", "bim", "square-probe"}
    assert list(doc["attacks"].values())[-1] == doc["robust_accuracy"]  # the probe, a check, counts too
    assert 0 <= doc["robust_accuracy"] <= doc["attacks"]["fgsm"] <= doc["clean_accuracy"] <= 1
    s = doc["settings"]
    assert s["version"] == "custom" and s["norm"] == "linf" and s["eps"] == 0.1 and s["seed"] == 2
    assert s["attacks"] == ["fgsm", "bim"] and "corruptions" not in s  # the options in effect
    assert [a["name"] for a in doc["attack_settings"]["attacks"]] == ["fgsm", "bim", "square-probe"]
    assert {"clean_s", "fgsm_s", "bim_s", "total_s", "load_s"} <= set(doc["timings"])
    rb = doc["robustbench"]
    assert rb["dataset"] == "digits" and rb["architecture"] == "mlp" and rb["eps"] == "0.1"
    assert rb["clean_acc"] == f"{100 * doc['clean_accuracy']:.2f}" and rb["autoattack_acc"] is None
    assert "gate" not in doc and "corruptions" not in doc
    with open(out / "samples.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 40 and rows[0].keys() >= {"index", "label", "robust", "broken_by", "linf", "l2"}
    assert sum(int(r["robust"]) for r in rows) == round(doc["robust_accuracy"] * 40)
    assert {r["broken_by"] for r in rows} <= {"", "misclassified", "fgsm", "bim", "square-probe"}
    html = (out / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "Accuracy after each attack" in html
    # the sections every verb's report has: settings and timings as tables, the gate's verdict
    assert "<h2>Settings</h2>" in html and "<h2>Timings</h2>" in html and "<pre>" not in html
    assert '<th scope="row">fail under</th>' not in html and "No gate: --fail-under was not given" in html
    assert "results.json: format robustest-eval-results" in html
    adv = torch.load(out / "adv.pt", weights_only=True)
    assert adv["x"].shape == (40, 1, 8, 8) and int(adv["robust"].sum()) == sum(int(r["robust"]) for r in rows)


def test_fail_under_exit_codes(mlp_digits_checkpoint, tmp_path: Path, capsys):
    # FGSM and BIM are weak: the Square probe breaks more, which the gate accepts here to test the threshold alone
    base = ["eval", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--eps", "0.2", *FAST,
            "--accept-flag", "gradient-free-breaks"]
    assert main([*base, "--out", str(tmp_path / "a"), "--fail-under", "0"]) == 0
    doc = json.loads((tmp_path / "a" / "results.json").read_text())
    assert doc["gate"] == {"fail_under": 0.0, "passed": True, "accuracy_passed": True,
                           "accepted_flags": ["gradient-free-breaks"], "blocking_flags": []}
    robust = doc["robust_accuracy"]
    assert robust < 1.0
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "b"), "--fail-under", f"{robust + 0.01:.4f}"]) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()  # the flags (accepted, so not blocking), then the one reason the gate failed
    assert "below --fail-under" in lines[-1] and all(" flag " in line for line in lines[:-1])
    assert json.loads((tmp_path / "b" / "results.json").read_text())["gate"]["passed"] is False
    assert main([*base, "--out", str(tmp_path / "c"), "--fail-under", f"{100 * robust:.4f}%"]) == 0
    # the verdict is in the report too, with the gate in the settings table
    passed = (tmp_path / "a" / "report.html").read_text()
    assert "The gate passed: robust accuracy" in passed and "is at least --fail-under 0.0000 (exit status 0)" in passed
    failed = (tmp_path / "b" / "report.html").read_text()
    assert f"The gate FAILED: robust accuracy {robust:.4f} is below --fail-under {robust + 0.01:.4f} (exit status 1)" \
        in failed
    assert '<th scope="row">fail under</th>' in failed


def test_report_when_every_broken_image_sits_at_eps(mlp_digits_checkpoint, tmp_path: Path, monkeypatch):
    """FGSM puts every broken image at exactly eps (norms one float32 ulp apart failed with 'Too many bins for data
    range': test_report): the report says so in a sentence instead of drawing a one-bar histogram, and
    report.html is written."""
    from robustest import report

    edges = []
    real = report.histogram_edges
    monkeypatch.setattr(report, "histogram_edges", lambda *a, **k: edges.append(real(*a, **k)) or edges[-1])
    out = tmp_path / "e"
    rc = main(["eval", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--eps", "0.2", "--version",
               "custom", "--attacks", "fgsm", "--limit", "60", "--no-progress", "--out", str(out)])
    assert rc == 0
    with open(out / "samples.csv") as fh:
        norms = {float(r["linf"]) for r in csv.DictReader(fh) if r["broken_by"] == "fgsm"}
    assert norms and max(norms) - min(norms) < 1e-6  # all at eps
    html = (out / "report.html").read_text()
    assert re.search(r"L-inf norms of the perturbations of the (\d+) broken images: all \1 values equal 0\.2000\.",
                     html) and html.count("data:image/png;base64,") >= 2  # the bars and the adversarial images
    assert not edges  # no histogram drawn


def _one_line_exit_2(args, capsys, match):
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # argparse errors exit from the parser
        rc = main(args)
        raise SystemExit(rc)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
    assert "Traceback" not in err


def test_bad_input(mlp_digits_checkpoint, tmp_path: Path, capsys):
    ck = mlp_digits_checkpoint
    base = ["eval", "--checkpoint", ck, "--dataset", "digits", "--limit", "20", "--no-progress", "--out",
            str(tmp_path / "o")]
    _one_line_exit_2([*base, "--eps", "0"], capsys, "eps must lie in (0, 1]")
    _one_line_exit_2([*base, "--eps", "1.5"], capsys, "eps must lie in (0, 1]")
    _one_line_exit_2([*base, "--eps", "-0.1", "--norm", "l2"], capsys, "eps must lie in (0, 1000] for the L2")
    _one_line_exit_2([*base, "--eps", "0.1", "--norm", "l7"], capsys, "invalid choice")
    _one_line_exit_2([*base, "--eps", "0.1", "--version", "plus"], capsys, "invalid choice")
    _one_line_exit_2([*base, "--eps", "0.1", "--attacks", "square"], capsys, "--version custom")
    _one_line_exit_2([*base, "--eps", "0.1", "--version", "custom"], capsys, "needs --attacks")
    _one_line_exit_2([*base, "--eps", "0.1", "--version", "custom", "--attacks", "deepfool"], capsys,
                     "unknown attack")
    _one_line_exit_2([*base, "--eps", "0.1", "--n-targets", "10"], capsys, "n_targets=10")
    _one_line_exit_2([*base, "--eps", "0.1", "--fail-under", "2"], capsys, "accuracy in [0, 1]")
    _one_line_exit_2([*base, "--eps", "0.1", "--corruptions", "nope"], capsys, "nope")
    _one_line_exit_2([*base, "--eps", "0.1", "--baseline", ck], capsys, "--corruptions")
    assert not (tmp_path / "o").exists()  # nothing written


def test_model_with_fewer_than_two_classes(tmp_path: Path, capsys):
    # the zoo refuses one-class models, so the model comes as a TorchScript archive
    torch.manual_seed(0)
    model = torch.jit.script(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 1)))
    ck = tmp_path / "one.pt"
    model.save(str(ck))
    npz = tmp_path / "zeros.npz"
    rng = np.random.default_rng(0)
    np.savez(npz, x=rng.integers(0, 256, (10, 8, 8), dtype=np.uint8), y=np.zeros(10, dtype=np.int64))
    _one_line_exit_2(["eval", "--checkpoint", str(ck), "--torchscript", "--dataset", "npz", "--data-dir", str(npz),
                      "--eps", "0.1", "--out", str(tmp_path / "o"), "--no-progress"], capsys, "at least 2 classes")
    assert not (tmp_path / "o").exists()


def test_corruptions_in_results(mlp_digits_checkpoint, tmp_path: Path):
    out = tmp_path / "c"
    rc = main(["eval", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--eps", "0.1", *FAST,
               "--corruptions", "brightness,gaussian_noise", "--severities", "1,5", "--baseline",
               mlp_digits_checkpoint, "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    c = doc["corruptions"]
    assert c["corruptions"] == ["brightness", "gaussian_noise"] and c["severities"] == [1, 5]
    assert c["mce"] == pytest.approx(1.0)  # the model is its own baseline
    assert doc["settings"]["baseline"] == mlp_digits_checkpoint
    assert doc["attack_settings"]["corruptions"]["baseline_checkpoint"] == mlp_digits_checkpoint
    assert doc["robustbench"]["corruptions_acc"] == f"{100 * c['mean_corruption_accuracy']:.2f}"
    assert "Common corruptions" in (out / "report.html").read_text()
