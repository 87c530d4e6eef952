"""``robustest certify``, ``robustest eval --certify`` (the bracket) and ``robustest suite build --certify`` end to
end on the built-in digits: outputs, schemas, samples.csv columns, the soundness gate and bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from robustest.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

DATA = ["--dataset", "digits", "--limit", "40", "--no-progress"]
EVAL = ["--version", "custom", "--attacks", "fgsm,bim", "--eps", "0.005"]  # IBP certifies about half at 0.005


@pytest.fixture(scope="module")
def unsupported_checkpoint(tmp_path_factory) -> str:
    """A resnet20 for digits (random weights): its option-A shortcuts slice tensors, which bounds do not cover."""
    from robustest import models
    from robustest.models.checkpoints import save_checkpoint

    torch.manual_seed(0)
    model = models.create("resnet20", num_classes=10, in_channels=1, input_size=8)
    path = tmp_path_factory.mktemp("unsupported") / "resnet20.pt"
    save_checkpoint(path, model)
    return str(path)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def _one_line_exit_2(argv: list[str], capsys, match: str) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert match in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------------ certify
def test_certify_crown_outputs(mlp_digits_checkpoint, tmp_path: Path, capsys, results_contract):
    out = tmp_path / "crown"
    assert main(["certify", "--checkpoint", mlp_digits_checkpoint, *DATA, "--eps", "0.01", "--method", "crown",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "certified" in printed and "wrote results.json, samples.csv, report.html" in printed
    doc = results_contract(out, "certify")  # header, settings and docs/schemas/certify.schema.json
    assert doc["method"] == "crown" and doc["norm"] == "linf" and doc["eps"] == 0.01 and doc["num_samples"] == 40
    assert 0 < doc["certified_accuracy"] <= doc["clean_accuracy"] <= 1
    c = doc["counts"]
    assert c["certified"] + c["not_certified"] == 40 and c["clean_correct"] + c["misclassified_clean"] == 40
    s = doc["settings"]
    assert s["method"] == "crown" and s["batch_size"] == 64 and s["limit"] == 40 and "sigma" not in s
    assert {"clean_s", "certify_s", "load_s", "total_s"} <= set(doc["timings"])
    assert doc["model"]["spec"]["name"] == "mlp" and doc["files"] == ["results.json", "samples.csv", "report.html"]
    rows = _rows(out / "samples.csv")
    assert len(rows) == 40 and list(rows[0]) == ["index", "label", "clean_pred", "clean_correct", "certified",
                                                 "lower_margin"]
    assert sum(int(r["certified"]) for r in rows) == c["certified"]
    assert all((float(r["lower_margin"]) > 0) == (r["certified"] == "1") for r in rows)
    html = (out / "report.html").read_text()
    assert "Certified accuracy" in html and "lower margin bounds" in html and "<h2>Settings</h2>" in html


def test_certify_smoothing_outputs(mlp_digits_checkpoint, tmp_path: Path, results_contract):
    out = tmp_path / "smooth"
    assert main(["certify", "--checkpoint", mlp_digits_checkpoint, *DATA, "--eps", "0.1", "--norm", "l2", "--method",
                 "smoothing", "--sigma", "0.25", "--n0", "10", "--n-samples", "200", "--out", str(out)]) == 0
    doc = results_contract(out, "certify")
    assert doc["method"] == "smoothing" and doc["smoothing"]["n"] == 200 and doc["smoothing"]["n0"] == 10
    assert doc["settings"]["sigma"] == 0.25 and doc["settings"]["alpha"] == 0.001 and doc["settings"]["n"] == 200
    rows = _rows(out / "samples.csv")
    assert {"certified", "radius", "smoothed_pred", "p_lower"} <= set(rows[0])
    assert all(r["certified"] == str(int(r["smoothed_pred"] == r["label"] and float(r["radius"]) >= 0.1))
               for r in rows)
    assert "smoothed classifier" in (out / "report.html").read_text()


@pytest.mark.parametrize("extra, match", [
    (["--method", "smoothing", "--sigma", "0.25"], "add --norm l2"),
    (["--method", "smoothing", "--norm", "l2"], "needs --sigma"),
    (["--method", "ibp", "--sigma", "0.25", "--n-samples", "10"], "--sigma, --n-samples apply to --method smoothing"),
    (["--method", "ibp", "--eps", "2"], "eps"),
    (["--method", "zonotope"], "invalid choice"),
])
def test_certify_bad_input(mlp_digits_checkpoint, tmp_path: Path, capsys, extra, match):
    argv = ["certify", "--checkpoint", mlp_digits_checkpoint, *DATA, "--eps", "0.1", *extra,
            "--out", str(tmp_path / "o")]
    _one_line_exit_2(argv, capsys, match)
    assert not (tmp_path / "o" / "results.json").exists()


def test_unsupported_layer_is_one_line_exit_2(unsupported_checkpoint, tmp_path: Path, capsys):
    m = ["--checkpoint", unsupported_checkpoint]
    line = _one_line_exit_2(["certify", *m, *DATA, "--eps", "0.01", "--out", str(tmp_path / "c")], capsys,
                            "certify cannot bound")
    assert line.startswith("robustest certify: error: ") and "supported layers" in line
    _one_line_exit_2(["eval", *m, *DATA, *EVAL, "--certify", "ibp", "--out", str(tmp_path / "e")], capsys,
                     "certify cannot bound")
    _one_line_exit_2(["suite", "build", *m, *DATA, "--eps", "0.01", "--k", "10", "--version", "fast", "--certify",
                      "crown", "--out", str(tmp_path / "s")], capsys, "certify cannot bound")
    assert not any((tmp_path / d / "results.json").exists() for d in ("c", "e", "s"))


# ------------------------------------------------------------------------------------------------ eval --certify
def test_eval_certify_brackets_the_truth(mlp_digits_checkpoint, tmp_path: Path, capsys, results_contract):
    out = tmp_path / "ev"
    assert main(["eval", "--checkpoint", mlp_digits_checkpoint, *DATA, *EVAL, "--certify", "ibp",
                 "--out", str(out)]) == 0
    assert "bracket (ibp): certified" in capsys.readouterr().out
    doc = results_contract(out, "eval")  # docs/schemas/eval.schema.json with the bracket section
    b = doc["bracket"]
    assert b["method"] == "ibp" and b["eps"] == 0.005 and b["num_samples"] == 40 and b["sound"] is True
    assert b["certified_accuracy"] <= b["robust_accuracy"] <= b["clean_accuracy"]
    assert 0 < b["certified_accuracy"] and b["clean_accuracy"] == pytest.approx(doc["clean_accuracy"])
    assert b["robust_accuracy"] >= doc["robust_accuracy"]  # only checked breaks count
    if not b["unverified_breaks"]:
        assert b["robust_accuracy"] == pytest.approx(doc["robust_accuracy"])
    c = b["counts"]
    assert c["certified"] + c["undecided"] + c["broken"] + c["unsound"] == 40 and c["unsound"] == 0
    assert c["broken"] == c["broken_by_attack"] + c["misclassified"] == round(40 * (1 - b["robust_accuracy"]))
    assert doc["settings"]["certify"] == "ibp" and {"certify_s", "bracket_s"} <= set(doc["timings"])
    assert "unsound-certificate" not in [f["name"] for f in doc["flags"]]
    rows = _rows(out / "samples.csv")
    assert {"bracket", "lower_margin"} <= set(rows[0])
    assert {lab: sum(r["bracket"] == lab for r in rows) for lab in ("certified", "undecided", "broken")} == \
        {k: c[k] for k in ("certified", "undecided", "broken")}
    for r in rows:  # consistent with the evaluation's own columns
        if r["bracket"] == "certified":
            assert r["robust"] == "1" and float(r["lower_margin"]) > 0
        if r["clean_correct"] == "0":
            assert r["bracket"] == "broken"
    html = (out / "report.html").read_text()
    assert "Certified, robust and clean accuracy" in html and "certified accuracy = the green part" in html
    assert ("Undecided samples" in html) == (c["undecided"] > 0)


def test_eval_certify_soundness_error_fails_the_gate(mlp_digits_checkpoint, tmp_path: Path, capsys, monkeypatch,
                                                     results_contract):
    """A certificate that claims every sample (clean errors included) is a soundness error: exit status 1 with or
    without --fail-under, the flag in results.json, 'unsound' rows in samples.csv, and it cannot be accepted."""
    from robustest import certify
    from robustest.certify import Certificate

    def claims_everything(model, x, y, eps, norm="linf", *, batch_size=None):
        return Certificate(torch.ones(x.shape[0], 10), torch.ones(x.shape[0], dtype=torch.bool), "ibp", eps, norm)

    monkeypatch.setattr(certify, "ibp", claims_everything)
    base = ["eval", "--checkpoint", mlp_digits_checkpoint, *DATA, *EVAL, "--certify", "ibp"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err
    assert "SOUNDNESS ERROR" in err and "flag unreliable unsound-certificate" in err
    doc = results_contract(tmp_path / "a", "eval")
    assert doc["bracket"]["sound"] is False and doc["reliable"] is False
    c = doc["bracket"]["counts"]  # every broken sample is unsound, every other one "certified"
    assert c["undecided"] == c["broken"] == 0 and c["unsound"] > 0 and c["certified"] + c["unsound"] == 40
    flag = next(f for f in doc["flags"] if f["name"] == "unsound-certificate")
    assert flag["severity"] == "unreliable" and flag["samples"] == doc["bracket"]["unsound_samples"]
    assert sum(r["bracket"] == "unsound" for r in _rows(tmp_path / "a" / "samples.csv")) == flag["num_samples"]
    html = (tmp_path / "a" / "report.html").read_text()
    assert "SOUNDNESS ERROR" in html and "No --fail-under gate, but the exit status is 1" in html
    assert main([*base, "--fail-under", "0", "--out", str(tmp_path / "b")]) == 1
    gate = json.loads((tmp_path / "b" / "results.json").read_text())["gate"]
    assert gate["passed"] is False and gate["accuracy_passed"] is True and "unsound-certificate" in \
        gate["blocking_flags"]
    capsys.readouterr()
    _one_line_exit_2([*base, "--accept-flag", "unsound-certificate", "--out", str(tmp_path / "c")], capsys,
                     "cannot be accepted")


def test_eval_certify_smoothing_is_refused(mlp_digits_checkpoint, tmp_path: Path, capsys):
    _one_line_exit_2(["eval", "--checkpoint", mlp_digits_checkpoint, *DATA, *EVAL, "--norm", "l2", "--certify",
                      "smoothing", "--out", str(tmp_path / "o")], capsys, "smoothed classifier")


# ------------------------------------------------------------------------------------------------ suite
def test_suite_build_and_check_with_certified_outcomes(mlp_digits_checkpoint, tmp_path: Path, capsys, monkeypatch,
                                                       results_contract):
    m = ["--checkpoint", mlp_digits_checkpoint]
    assert main(["suite", "build", *m, "--dataset", "digits", "--limit", "120", "--eps", "0.005", "--k", "30",
                 "--version", "fast", "--neighbors", "4", "--certify", "ibp", "--no-progress",
                 "--out", str(tmp_path / "s")]) == 0
    doc = results_contract(tmp_path / "s", "suite")
    assert doc["suite"]["certify"] == "ibp" and doc["settings"]["certify"] == "ibp"
    assert "certified_accuracy" in doc["baseline"]
    assert main(["suite", "check", "--suite", str(tmp_path / "s"), *m, "--no-progress",
                 "--out", str(tmp_path / "same")]) == 0
    same = results_contract(tmp_path / "same", "suite")
    assert same["certified_regression"] is False and same["lost_certificates"] == 0 and same["verdict"] == "pass"
    assert same["suite"]["certify"] == "ibp" and "certified accuracy" in (tmp_path / "same" / "report.html").read_text()
    # the candidate loses every certificate, its robust outcomes unchanged: a regression, exit status 1
    from robustest.suite import Suite
    from robustest.suite import check as check_mod

    suite = Suite.load(tmp_path / "s" / "suite.pt")
    fixed = {"clean": suite.clean, "robust": suite.robust, "corruption": suite.corruption,
             "certified": torch.zeros_like(suite.certified), "seconds": {}}
    monkeypatch.setattr(check_mod, "evaluate_outcomes", lambda *a, **k: fixed)
    capsys.readouterr()
    assert main(["suite", "check", "--suite", str(tmp_path / "s"), *m, "--no-progress",
                 "--out", str(tmp_path / "lost")]) == 1
    err = capsys.readouterr().err
    assert "lost their certificate" in err and "regression" in err
    lost = results_contract(tmp_path / "lost", "suite")
    assert lost["certified_regression"] is True and lost["regression"] is False and lost["verdict"] == "regression"
    assert lost["lost_certificates"] == int(suite.certified.sum()) and lost["failed"] is True
