"""CLI verbs analyze / validate / enhance on digits, including bad inputs."""

from __future__ import annotations

import json

import pytest
import torch

from robustest.cli import main


@pytest.fixture
def checkpoint(tmp_path, trained_digits_model):
    from robustest.models.checkpoints import save_checkpoint

    path = tmp_path / "model.pt"
    save_checkpoint(path, trained_digits_model)
    return path


def test_analyze_then_validate_from_file(tmp_path, checkpoint, capsys, results_contract):
    out = tmp_path / "an"
    rc = main(["analyze", "--checkpoint", str(checkpoint), "--dataset", "digits", "--limit", "120",
               "--neighbors", "8", "--eps", "0.8", "--top", "8", "--out", str(out), "--no-progress"])
    assert rc == 0
    res = results_contract(out, "analyze")
    assert res["n"] == 120 and len(res["weakest"]) == 20
    assert res["settings"]["neighbors"] == 8 and res["settings"]["quantize"] is True
    assert "radius_eps_max" not in res["settings"] and "radius" not in res
    scores = [r["score"] for r in res["weakest"]]
    assert scores == sorted(scores, reverse=True)
    assert "<img" in (out / "report.html").read_text()
    an = torch.load(out / "analysis.pt", weights_only=True)
    assert an["score"].shape == (120,)

    val = tmp_path / "val"
    rc = main(["validate", "--checkpoint", str(checkpoint), "--dataset", "digits", "--limit", "120",
               "--analysis", str(out / "analysis.pt"), "--strategy", "weak", "--k", "10",
               "--perturbations", "fgsm,contrast",
               "--attack-eps", "0.1", "--severities", "2", "--test-limit", "40", "--out", str(val), "--no-progress"])
    assert rc == 0
    res = results_contract(val, "validate")
    assert res["settings"]["analysis"] == str(out / "analysis.pt") and "neighbors" not in res["settings"]
    assert res["settings"]["perturbations"] == ["fgsm", "contrast"] and res["settings"]["attack_eps"] == [0.1]
    assert res["settings"]["severities"] == [2] and res["settings"]["k"] == 10 and "threshold" not in res["settings"]
    assert res["weak_set"]["n"] == 10 and res["weak_set"]["indices"] == [r["index"] for r in
                                                                         json.loads((out / "results.json")
                                                                                    .read_text())["weakest"][:10]]
    types = {r["type"]: r for r in res["table"]}
    assert set(types) == {"clean", "fgsm", "contrast"}
    assert types["fgsm"]["test_error"] is not None and types["fgsm"]["label"] in ("strength", "weakness")
    assert res["test"]["n"] == 40
    assert set(res["weaknesses"]) | set(res["strengths"]) == {"fgsm", "contrast"}
    for f in ("weakset.pt", "weakset.json", "validation.pt", "report.html"):
        assert (val / f).is_file()
    assert "fgsm" in capsys.readouterr().out


def test_validate_inline_threshold_and_bad_inputs(tmp_path, checkpoint, capsys, results_contract):
    out = tmp_path / "v"
    # an impossible threshold gives an empty weak set: a one-line error, exit code 2
    rc = main(["validate", "--checkpoint", str(checkpoint), "--dataset", "digits", "--limit", "60",
               "--neighbors", "4", "--threshold", "0.99", "--correct-only", "--eps", "0.01",
               "--perturbations", "contrast", "--out", str(out), "--no-progress"])
    assert rc == 2 and "weak set is empty" in capsys.readouterr().err
    # analysis of another data set size
    an = tmp_path / "an"
    assert main(["analyze", "--checkpoint", str(checkpoint), "--dataset", "digits", "--limit", "30",
                 "--neighbors", "2", "--radius-eps-max", "0.3", "--out", str(an), "--no-progress"]) == 0
    res = results_contract(an, "analyze")
    assert 0 <= res["radius"]["frac_not_flipped"] <= 1 and res["settings"]["radius_eps_max"] == 0.3
    assert torch.load(an / "radius.pt").shape == (30,)
    rc = main(["validate", "--checkpoint", str(checkpoint), "--dataset", "digits", "--limit", "40",
               "--analysis", str(an / "analysis.pt"), "--out", str(out), "--no-progress"])
    assert rc == 2 and "analyses 30 samples" in capsys.readouterr().err
    rc = main(["validate", "--checkpoint", str(checkpoint), "--dataset", "digits", "--k", "5",
               "--perturbations", "no_such_thing", "--neighbors", "2", "--limit", "20", "--out", str(out),
               "--no-progress"])
    assert rc == 2 and "unknown perturbation" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["validate", "--checkpoint", str(checkpoint), "--dataset", "digits", "--k", "5", "--fraction", "0.1",
              "--out", str(out)])
    assert e.value.code == 2
    rc = main(["analyze", "--checkpoint", str(tmp_path / "missing.pt"), "--dataset", "digits", "--out", str(out)])
    assert rc == 2


def test_enhance_verb(tmp_path, checkpoint, capsys, results_contract):
    val = tmp_path / "results.json"
    val.write_text(json.dumps({"weaknesses": ["gaussian_noise", "pgd"]}))
    out = tmp_path / "enh"
    rc = main(["enhance", "--checkpoint", str(checkpoint), "--dataset", "digits", "--limit", "96",
               "--weaknesses", str(val), "--epochs", "1", "--adv-steps", "2", "--eval-limit", "0",
               "--out", str(out), "--no-progress"])
    assert rc == 0
    res = results_contract(out, "enhance")
    assert res["settings"]["weaknesses"] == ["gaussian_noise", "pgd"] and res["settings"]["adv_steps"] == 2
    assert "split" not in res["settings"] and res["before"] == {} and res["after"] == {}
    assert "gaussian_noise" in res["enhance"]["pool"] and res["enhance"]["weaknesses"] == ["gaussian_noise", "pgd"]
    assert "<p>1 epoch; pool:" in (out / "report.html").read_text()  # not "1 epochs"
    from robustest.models.checkpoints import load_checkpoint

    m = load_checkpoint(out / "model.pt")
    assert m.robustest_metadata["weaknesses"] == ["gaussian_noise", "pgd"]
    assert (out / "report.html").is_file()
    rc = main(["enhance", "--checkpoint", str(checkpoint), "--dataset", "digits", "--weaknesses", "nonsense",
               "--epochs", "1", "--out", str(out)])
    assert rc == 2 and "unknown weakness" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    rc = main(["enhance", "--checkpoint", str(checkpoint), "--dataset", "digits", "--weaknesses", str(bad),
               "--epochs", "1", "--out", str(out)])
    assert rc == 2 and "no 'weaknesses' list" in capsys.readouterr().err


def test_analyze_amp_bf16_is_recorded_and_is_a_different_run(tmp_path, checkpoint, capsys, results_contract):
    base = ["analyze", "--checkpoint", str(checkpoint), "--dataset", "digits", "--limit", "60", "--neighbors", "4",
            "--no-progress", "--out", str(tmp_path / "a")]
    assert main(base) == 0
    assert main([*base, "--amp", "bf16"]) == 0
    err = capsys.readouterr().err
    assert "reused" not in err  # float32 steps are not reused for a bf16 run
    res = results_contract(tmp_path / "a", "analyze")
    assert res["settings"]["amp"] == "bf16"
    assert main([*base[:-2], "--amp", "fp16", "--out", str(tmp_path / "b")]) == 2
    assert "needs CUDA" in capsys.readouterr().err


def test_noise_width_is_the_analysis_option_and_eps_its_alias() -> None:
    """analyze/validate's noise width is --noise-width (not an attack radius); --eps is the same option."""
    from robustest.cli import build_parser
    from robustest.cli.args import options_from_args
    from robustest.weakrobust.analyze_pipeline import AnalysisOptions

    parser = build_parser()
    base = ["--checkpoint", "m.pt", "--dataset", "digits", "--out", "o"]

    def eps(argv: list[str]) -> float:
        return options_from_args(AnalysisOptions, parser.parse_args(argv))["eps"]

    for verb in ("analyze", "validate"):
        assert eps([verb, *base, "--noise-width", "0.1"]) == 0.1
        assert eps([verb, *base, "--eps", "0.1"]) == 0.1
        assert eps([verb, *base]) == 0.22
