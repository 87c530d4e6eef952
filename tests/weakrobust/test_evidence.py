"""The weak-robust evidence benchmark (benchmarks/weakrobust_evidence.py) on a tiny digits run, and
reproduce_weakrobust.py's --dataset / --arch-map."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from robustest.core.errors import ConfigError

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def script(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_vectorised_spearman_matches_scipy():
    ev = script("weakrobust_evidence")
    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, size=(7, 12)).astype(float)  # ties
    b = rng.normal(size=(7, 12))
    got = ev.spearman_last(a, b)
    want = [spearmanr(a[i], b[i]).statistic for i in range(7)]
    assert np.allclose(got, want)
    assert np.isnan(ev.spearman_last(np.ones(5), np.arange(5.0)))  # constant: undefined


TINY = ["--dataset", "digits", "--models", "mlp-w32-e2,cnn-w4-e3,digits_cnn-e1", "--train-size", "120",
        "--test-size", "40", "--sizes", "10", "--seeds", "0", "1", "--neighbors", "4", "--attack-eps", "0.1",
        "--attack-steps", "1", "--severities", "3", "--corruptions", "gaussian_noise,contrast", "--strata", "3",
        "--bootstrap", "50", "--draws", "2"]


def test_evidence_run_statistics_and_resume(tmp_path, capsys):
    ev = script("weakrobust_evidence")
    out = tmp_path / "ev"
    res = ev.main([*TINY, "--out", str(out)])
    assert [m["name"] for m in res["models"]] == ["mlp-w32-e2", "cnn-w4-e3", "digits_cnn-e1"]
    assert res["n_train"] == 120 and res["n_test"] == 40
    assert res["types"] == ["fgsm", "pgd", "bim", "rfgsm", "mifgsm", "gaussian_noise", "contrast"]
    rows = {(r["strategy"], r["k"], r["signal"]): r for r in res["ranking"]}
    for strat in ("weak", "weak-correct", "stratified", "stratified-neyman", "random"):
        for sig in ("adversarial", "corruption", "per-type"):
            r = rows[(strat, 10, sig)]
            assert len(r["rho_per_draw"]) == (2 if strat.startswith("weak") else 4)  # 2 seeds (x 2 draws)
            lo, hi = r["ci95"]
            assert np.isnan(lo) or -1 <= lo <= hi <= 1
            assert ("minus_random" in r) == (strat != "random")
    assert ("all", 120, "adversarial") in rows
    for p in res["profile"]:
        assert 0 <= p["label_agreement_mean"] <= 1 and len(p["rho_types_per_draw"]) in (2, 4)
    est = {r["strategy"]: r for r in res["estimation"] if r["k"] == 10}
    assert est["weak"]["bias_adv_vs_train"] >= 0  # the weakest samples err at least as often as the average
    # the whole training set estimates itself exactly
    assert next(r for r in res["estimation"] if r["strategy"] == "all")["mae_adv_vs_train"] == 0
    assert (out / "evidence.md").read_text().startswith("Models")
    assert sorted(p.name for p in (out / "models").iterdir()) == ["cnn-w4-e3.pt", "digits_cnn-e1.pt", "mlp-w32-e2.pt"]
    capsys.readouterr()
    again = ev.main([*TINY, "--out", str(out)])  # resumed: every model reused, the same statistics
    assert capsys.readouterr().out.count("done before, reused") == 3
    assert json.dumps(again["ranking"]) == json.dumps(res["ranking"])
    with pytest.raises(ConfigError, match="other settings"):
        ev.main([*TINY, "--neighbors", "5", "--out", str(out)])


@pytest.mark.parametrize("argv, fragment", [
    (["--models", "mlp-w32-e2,nope,cnn-w4-e3"], "unknown model 'nope'"),
    (["--models", "mlp-w32-e2,cnn-w4-e3"], "at least 3 models"),
    (["--corruptions", "fog,smoke"], "unknown corruption 'smoke'"),
])
def test_evidence_refuses_bad_values(tmp_path, argv, fragment):
    ev = script("weakrobust_evidence")
    with pytest.raises(ConfigError, match=fragment):
        ev.main([*argv, "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_reproduce_takes_any_dataset_and_names_the_arch_map(tmp_path):
    wr = script("reproduce_weakrobust")
    with pytest.raises(ConfigError) as exc:
        wr.main(["--part", "family", "--dataset", "digits", "--out", str(tmp_path / "o")])
    msg = str(exc.value)
    assert "--arch-map lenet1=NAME" in msg and "digits_cnn" in msg and "1x8x8" in msg and "\n" not in msg
    assert not (tmp_path / "o" / "family.json").exists()
    assert wr.arch_map("lenet1=digits_cnn, lenet5=mlp") == {"lenet1": "digits_cnn", "lenet5": "mlp"}
    with pytest.raises(argparse.ArgumentTypeError):
        wr.arch_map("lenet1")
    args = argparse.Namespace(dataset="digits", arch_map={"lenet1": "digits_cnn", "lenet5": "digits_cnn"})
    wr.check_archs(["mlp", "lenet1", "lenet5"], args, torch.zeros(2, 1, 8, 8), 10)  # fits once mapped


@pytest.mark.slow
def test_reproduce_family_on_digits_end_to_end(tmp_path):
    wr = script("reproduce_weakrobust")
    out = tmp_path / "fam"
    wr.main(["--part", "family", "--dataset", "digits", "--arch-map", "lenet1=digits_cnn,lenet5=digits_cnn",
             "--max-models", "3", "--train-size", "80", "--test-size", "20", "--random-pool", "20", "--sizes", "4", "8",
             "--draws", "2", "--neighbors", "2", "--eps-grid", "0.1", "--attack-steps", "1", "--out", str(out)])
    fam = json.loads((out / "family.json").read_text())
    assert len(fam["models"]) == 3 and fam["config"]["dataset"] == "digits"
