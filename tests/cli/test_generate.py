"""Tests of ``robustest generate`` on the built-in digits data set."""

from __future__ import annotations

import json

import pytest
import torch

from robustest import data, metrics
from robustest.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")  # two shared cores: one intra-op thread


@pytest.fixture
def checkpoint(tmp_path, trained_digits_model):
    from robustest.models.checkpoints import save_checkpoint

    path = tmp_path / "model.pt"
    save_checkpoint(path, trained_digits_model)
    return path


def _gen(checkpoint, out, *extra):
    return main(["generate", "--checkpoint", str(checkpoint), "--dataset", "digits", "--out", str(out),
                 "--no-progress", *extra])


def test_generate_pgd_writes_tests_summary_and_grid(checkpoint, tmp_path, trained_digits_model, capsys,
                                                    results_contract):
    out = tmp_path / "pgd"
    assert _gen(checkpoint, out, "--method", "pgd", "--limit", "60", "--steps", "5", "--eps", "0.15") == 0
    assert "tests" in capsys.readouterr().out
    t = data.load_tests(out / "tests.pt")
    assert t["method"] == "pgd"
    x_all, y_all = data.load("digits", split="train").tensors
    n = t["x"].shape[0]
    assert 0 < n <= 60
    x0 = x_all[t["x0_index"]]
    assert torch.equal(t["y"], y_all[t["x0_index"]])
    assert float((t["x"] - x0).abs().max()) <= 0.15 + 1e-5
    assert float(t["x"].min()) >= 0 and float(t["x"].max()) <= 1
    with torch.no_grad():
        pred = trained_digits_model(t["x"]).argmax(1)
    assert bool((pred != t["y"]).all()), "default keeps only successful adversarial examples"
    assert torch.equal(pred, t["extra"]["pred"])
    expected_fol = metrics.fol(trained_digits_model, t["x"], t["y"], x0=x0, eps=0.15, norm="linf")
    assert torch.allclose(t["fol"], expected_fol, rtol=1e-4, atol=1e-5)
    s = json.loads((out / "summary.json").read_text())
    assert s["method"] == "pgd" and s["seeds"] == 60 and s["tests"] == n
    assert abs(s["success_rate"] - n / 60) < 1e-9
    assert s["fol"]["quantiles"]["q50"] == pytest.approx(float(torch.quantile(t["fol"].double(), 0.5)), rel=1e-6)
    assert s["perturbation"]["linf"]["max"] <= 0.15 + 1e-5
    for name in ("examples.png", "fol_hist.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = results_contract(out, "generate")
    assert res["settings"] == {"checkpoint": str(checkpoint), "dataset": "digits", "split": "train", "limit": 60,
                               "method": "pgd", "eps": 0.15, "steps": 5, "norm": "linf", "random_start": True,
                               "restarts": 1, "keep_all": False, "fol_norm": "linf", "fol_eps": 0.15,
                               "batch_size": 256, "grid": 8, "seed": 0, "device": "cpu"}
    assert res["tests"] == n and res["success_rate"] == s["success_rate"]
    assert "<img" in (out / "report.html").read_text()
    # the tests file is a data set other verbs can read
    ds = data.load("tests", root=out / "tests.pt")
    assert len(ds) == n


def test_generate_keep_all_and_other_attacks(checkpoint, tmp_path):
    out = tmp_path / "fgsm"
    assert _gen(checkpoint, out, "--method", "fgsm", "--limit", "30", "--eps", "0.05", "--keep-all") == 0
    t = data.load_tests(out / "tests.pt")
    assert t["x"].shape[0] == 30 and torch.equal(t["x0_index"], torch.arange(30))
    for method, extra in [("apgd", ["--steps", "4", "--norm", "l2", "--eps", "1.0"]),
                          ("cw", ["--steps", "10", "--binary-steps", "2"]),
                          ("mifgsm", ["--steps", "3"]), ("bim", ["--steps", "3"]), ("rfgsm", [])]:
        o = tmp_path / method
        assert _gen(checkpoint, o, "--method", method, "--limit", "20", *extra) == 0, method
        s = json.loads((o / "summary.json").read_text())
        assert s["tests"] == data.load_tests(o / "tests.pt")["x"].shape[0]
        assert 0.0 <= s["success_rate"] <= 1.0
    s = json.loads((tmp_path / "apgd" / "summary.json").read_text())
    if s["tests"]:
        assert s["perturbation"]["l2"]["max"] <= 1.0 + 1e-5


def test_generate_fol_fuzz(checkpoint, tmp_path, trained_digits_model, results_contract):
    out = tmp_path / "fol"
    assert _gen(checkpoint, out, "--method", "fol-fuzz", "--limit", "12", "--steps", "4") == 0
    t = data.load_tests(out / "tests.pt")
    assert t["method"] == "fol-fuzz" and t["fol"] is not None
    if t["x"].shape[0]:
        with torch.no_grad():
            pred = trained_digits_model(t["x"]).argmax(1)
            seed_pred = trained_digits_model(data.load("digits", split="train").tensors[0][t["x0_index"]]).argmax(1)
        assert bool((pred != seed_pred).all())
    s = json.loads((out / "summary.json").read_text())
    assert "fuzz_stats" in s and s["seeds"] == 12
    settings = results_contract(out, "generate")["settings"]
    assert settings["steps"] == 4 and settings["max_rel_l2"] == 0.5
    assert not {"keep_all", "restarts", "random_start", "iterations", "coverage"} & set(settings)


def test_generate_cov_fuzz(checkpoint, tmp_path, results_contract):
    out = tmp_path / "cov"
    assert _gen(checkpoint, out, "--method", "cov-fuzz", "--limit", "16", "--iterations", "3",
                "--profile-limit", "300", "--batch-size", "32") == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["params"]["profile_images"] == 300
    assert len(s["coverage_history"]) >= 1
    assert data.load_tests(out / "tests.pt")["method"] == "cov-fuzz"
    settings = results_contract(out, "generate")["settings"]
    assert settings["iterations"] == 3 and settings["profile_limit"] == 300 and settings["coverage"] == "kmnc"
    assert not {"keep_all", "steps", "max_rel_l2"} & set(settings)


@pytest.mark.parametrize("argv, message", [
    (["--method", "fgsm", "--norm", "l2"], "--norm l2"),
    (["--method", "bim", "--restarts", "3"], "--restarts"),
    (["--method", "apgd", "--alpha", "0.1"], "--alpha"),
    (["--method", "fol-fuzz", "--keep-all"], "--keep-all"),
])
def test_generate_bad_options_one_line_exit_2(checkpoint, tmp_path, capsys, argv, message):
    assert _gen(checkpoint, tmp_path / "bad", "--limit", "5", *argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_generate_bad_inputs(checkpoint, tmp_path, capsys):
    # missing checkpoint
    assert main(["generate", "--checkpoint", str(tmp_path / "nope.pt"), "--dataset", "digits", "--method", "fgsm",
                 "--out", str(tmp_path / "o")]) == 2
    # a file that is not a checkpoint
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    assert main(["generate", "--checkpoint", str(junk), "--dataset", "digits", "--method", "fgsm",
                 "--out", str(tmp_path / "o")]) == 2
    capsys.readouterr()
    # argparse-level errors: unknown method, negative eps
    with pytest.raises(SystemExit) as exc:
        _gen(checkpoint, tmp_path / "o", "--method", "deepfool")
    assert exc.value.code == 2
    capsys.readouterr()
    for eps in ("-0.1", "0", "1.5"):  # checked against --norm before any work
        assert _gen(checkpoint, tmp_path / "e", "--method", "pgd", "--eps", eps) == 2
        assert "eps must lie in (0, 1] for the L-inf threat model" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()
    # --out is an existing file
    f = tmp_path / "file"
    f.write_text("x")
    assert _gen(checkpoint, f, "--method", "fgsm") == 2
    assert "not a folder" in capsys.readouterr().err
