"""Validation-set strategies of select_weak (weak, weak-correct, stratified, random), weighted validation
results, and the validate verb's --strategy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from robustest import weakrobust as wr
from robustest.cli import main
from robustest.core.errors import ConfigError, DataError


def _analysis(n: int = 1000, seed: int = 0) -> wr.Analysis:
    """A skewed score distribution like a trained model's: most samples robust (score 0), a tail of weak ones."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g)
    score = torch.where(u < 0.6, torch.zeros(n), u**3)
    frac = (score * 1.2).clamp(max=1.0)
    correct = torch.rand(n, generator=g) > score * 0.5
    return wr.Analysis(score=score, frac_misclassified=frac, clean_correct=correct, clean_score=torch.zeros(n),
                       top_wrong=torch.zeros(n, dtype=torch.long), label=torch.arange(n) % 10,
                       index=torch.arange(n), params={"eps": 0.5})


def _population_error(a: wr.Analysis) -> torch.Tensor:
    """A per-sample 0/1 'error' that depends on weakness, as perturbation errors do (fixed, seeded)."""
    g = torch.Generator().manual_seed(123)
    return (torch.rand(len(a), generator=g) < 0.1 + 0.85 * a.score).double()


def test_stratified_set_shape_weights_and_rule():
    a = _analysis()
    s = wr.select_weak(a, k=50, strategy="stratified", strata=10, seed=3)
    assert len(s) == 50 and len(set(s.indices.tolist())) == 50
    assert s.weights is not None and s.weights.dtype == torch.float64
    assert float(s.weights.sum()) == pytest.approx(1.0)
    assert torch.allclose(s.weights, torch.full((50,), 1 / 50, dtype=torch.float64))  # 100 per stratum, 5 each
    assert s.rule["strategy"] == "stratified" and s.rule["strata"] == 10 and s.rule["k"] == 50
    assert s.rule["stratum_sizes"] == [100] * 10 and s.rule["stratum_samples"] == [5] * 10
    assert torch.all(s.scores[:-1] >= s.scores[1:])  # weakest first
    # each stratum's weights add up to its share of the analysed samples, also for uneven allocations
    u = wr.select_weak(a, k=37, strategy="stratified", strata=7, seed=0)
    rank = torch.empty(len(a), dtype=torch.long)
    rank[a.order()] = torch.arange(len(a))
    stratum = rank[u.indices] * 7 // len(a)
    sizes = torch.tensor(u.rule["stratum_sizes"], dtype=torch.float64)
    for j in range(7):
        assert float(u.weights[stratum == j].sum()) == pytest.approx(float(sizes[j]) / len(a))
        assert int((stratum == j).sum()) == u.rule["stratum_samples"][j]
    # reproducible by seed
    assert torch.equal(wr.select_weak(a, k=50, strategy="stratified", seed=3).indices, s.indices)
    assert not torch.equal(wr.select_weak(a, k=50, strategy="stratified", seed=4).indices, s.indices)


def test_stratified_estimate_is_unbiased_with_less_variance_than_random():
    a = _analysis()
    e = _population_error(a)
    truth = float(e.mean())
    strat, rand = [], []
    for seed in range(300):
        s = wr.select_weak(a, k=40, strategy="stratified", seed=seed)
        strat.append(float((e[s.indices] * s.weights).sum()))
        r = wr.select_weak(a, k=40, strategy="random", seed=seed)
        assert r.weights is None and len(r) == 40
        rand.append(float(e[r.indices].mean()))
    strat, rand = np.array(strat), np.array(rand)
    # unbiased: the mean of 300 estimates lies within 4 standard errors of the population error
    assert abs(strat.mean() - truth) < 4 * strat.std() / np.sqrt(len(strat))
    assert abs(rand.mean() - truth) < 4 * rand.std() / np.sqrt(len(rand))
    assert strat.var() < 0.8 * rand.var()  # the strata differ in error: stratification removes that part


def test_neyman_allocation_favours_uncertain_strata_and_stays_unbiased():
    a = _analysis()
    s = wr.select_weak(a, k=60, strategy="stratified", allocation="neyman", strata=10, seed=0)
    alloc = s.rule["stratum_samples"]
    assert sum(alloc) == 60 and min(alloc) >= 2 and s.rule["allocation"] == "neyman"
    # the robust strata (no neighbour wrong: pilot standard deviation 0) and the weakest one (nearly every
    # neighbour wrong) get the floor; the strata in between, with error probabilities near 1/2, get the rest
    assert alloc[0] == 2 and alloc[4:] == [2] * 6 and min(alloc[1:4]) > 10
    assert float(s.weights.sum()) == pytest.approx(1.0)
    e = _population_error(a)
    est = [float((e[t.indices] * t.weights).sum()) for t in
           (wr.select_weak(a, k=60, strategy="stratified", allocation="neyman", seed=i) for i in range(200))]
    assert abs(np.mean(est) - float(e.mean())) < 4 * np.std(est) / np.sqrt(len(est))


def test_sizes_of_sampled_sets_and_weak_correct():
    a = _analysis(200)
    assert len(wr.select_weak(a, fraction=0.1, strategy="random")) == 20
    thr = int((a.frac_misclassified > 0.5).sum())
    assert len(wr.select_weak(a, threshold=0.5, strategy="stratified")) == thr
    assert len(wr.select_weak(a, strategy="stratified")) == min(wr.DEFAULT_SUBSET_SIZE, 200)
    small = wr.select_weak(a, k=3, strategy="stratified", strata=10)  # fewer samples than strata: 3 strata
    assert len(small) == 3 and small.rule["strata"] == 3
    wc = wr.select_weak(a, k=10, strategy="weak-correct")
    assert torch.equal(wc.indices, wr.select_weak(a, k=10, correct_only=True).indices)
    assert wc.rule["strategy"] == "weak-correct" and wc.weights is None
    assert wr.select_weak(a, k=10).rule["strategy"] == "weak"


@pytest.mark.parametrize("kwargs, fragment", [
    ({"strategy": "weakest"}, "unknown strategy 'weakest'"),
    ({"strategy": "stratified", "allocation": "optimal"}, "unknown allocation 'optimal'"),
    ({"strategy": "stratified", "strata": 0}, "strata must be an integer >= 1"),
    ({"strategy": "stratified", "correct_only": True}, "correct_only applies to the weak strategies"),
    ({"strategy": "random", "per_class": True}, "per_class applies to the weak strategies"),
    ({"strategy": "random", "k": 0}, "k must be >= 1"),
])
def test_select_weak_refuses_bad_values(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment) as exc:
        wr.select_weak(_analysis(50), **kwargs)
    assert "\n" not in str(exc.value)


def test_weighted_validation_result_and_subset(tmp_path):
    wrong = torch.tensor([[0, 0, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    keys = [("clean", "clean", 0.0), ("attack", "fgsm", 0.1)]
    plain = wr.ValidationResult(keys, wrong, torch.arange(4), torch.zeros(4, dtype=torch.long))
    assert plain.errors()[keys[0]] == 0.5 and not plain.weighted
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    res = wr.ValidationResult(keys, wrong, torch.arange(4), torch.zeros(4, dtype=torch.long), weights=w)
    assert res.errors()[keys[0]] == pytest.approx(0.7) and res.errors()[keys[1]] == pytest.approx(0.1)
    assert res.summary()["weighted"] is True and res.clean_error == pytest.approx(0.7)
    sub = res.subset([0, 3])  # keeps the weights, renormalised
    assert sub.errors()[keys[0]] == pytest.approx(0.4 / 0.5)
    sub = plain.subset([0, 2], weights=[3.0, 1.0])
    assert sub.errors()[keys[0]] == pytest.approx(0.25) and sub.errors()[keys[1]] == pytest.approx(0.75)
    res.save(tmp_path / "v.pt")
    back = wr.ValidationResult.load(tmp_path / "v.pt")
    assert back.weighted and back.errors() == res.errors()
    with pytest.raises(DataError, match="weights must be 4"):
        wr.ValidationResult(keys, wrong, torch.arange(4), torch.zeros(4, dtype=torch.long), weights=torch.ones(3))


class _Const(torch.nn.Module):
    """Always predicts class 1."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tensor([0.0, 1.0, 0.0]).expand(x.shape[0], 3) + 0 * x.flatten(1).sum(1, keepdim=True)


def test_validate_weights_weak_set_and_keyword():
    x = torch.rand(6, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([1, 0, 1, 2, 1, 1])
    ws = wr.WeakSet(indices=torch.tensor([0, 1, 3]), scores=torch.zeros(3), frac_misclassified=torch.zeros(3),
                    labels=y[[0, 1, 3]], weights=torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64))
    res = wr.validate(_Const(), (x, y), ws, perturbations="contrast", severities=(1,))
    assert res.weighted and res.clean_error == pytest.approx(0.5)  # samples 1 and 3 are wrong: 0.25 + 0.25
    assert res.mce == pytest.approx(0.5)
    res = wr.validate(_Const(), (x, y), torch.tensor([0, 1, 3]), perturbations="contrast", severities=(1,),
                      weights=[0.0, 1.0, 0.0])
    assert res.clean_error == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="weights must be 3"):
        wr.validate(_Const(), (x, y), torch.tensor([0, 1, 3]), perturbations="contrast", weights=[1.0, 2.0])


# ------------------------------------------------------------------------------------------------- CLI
@pytest.fixture
def checkpoint(tmp_path, trained_digits_model):
    from robustest.models.checkpoints import save_checkpoint

    path = tmp_path / "model.pt"
    save_checkpoint(path, trained_digits_model)
    return path


def test_cli_reads_the_library_constants():
    from robustest.cli import validate as cli_wr
    from robustest.selection import strata
    from robustest.weakrobust import weakset

    assert cli_wr.STRATEGIES is weakset.STRATEGIES and cli_wr.ALLOCATIONS is strata.ALLOCATIONS
    assert cli_wr.DEFAULT_SUBSET_SIZE is weakset.DEFAULT_SUBSET_SIZE
    assert cli_wr.DEFAULT_STRATEGY in weakset.STRATEGIES


def test_validate_strategies_from_the_cli(tmp_path, checkpoint, capsys, results_contract):
    an = tmp_path / "an"
    assert main(["analyze", "--checkpoint", str(checkpoint), "--dataset", "digits", "--limit", "150",
                 "--neighbors", "4", "--eps", "0.8", "--out", str(an), "--no-progress"]) == 0
    base = ["validate", "--checkpoint", str(checkpoint), "--dataset", "digits", "--limit", "150",
            "--analysis", str(an / "analysis.pt"), "--perturbations", "fgsm,contrast", "--attack-eps", "0.1",
            "--severities", "2", "--test-limit", "30", "--no-progress"]
    out = tmp_path / "strat"
    assert main([*base, "--strategy", "stratified", "--k", "20", "--strata", "4", "--out", str(out)]) == 0
    res = results_contract(out, "validate")
    assert res["settings"]["strategy"] == "stratified" and res["settings"]["strata"] == 4
    assert res["settings"]["allocation"] == "proportional" and res["settings"]["k"] == 20
    assert res["weak_set"]["strategy"] == "stratified" and res["weak_set"]["n"] == 20
    assert sum(res["weak_set"]["weights"]) == pytest.approx(1.0) and res["validation"]["weighted"] is True
    assert res["test"]["weighted"] is False
    # the table's errors are the weighted ones
    v = wr.ValidationResult.load(out / "validation.pt")
    assert v.weighted and res["validation"]["clean_error"] == pytest.approx(v.clean_error)
    w = torch.tensor(res["weak_set"]["weights"], dtype=torch.float64)
    assert v.clean_error == pytest.approx(float((v.wrong[0].double() * w).sum()))
    out = tmp_path / "rand"
    assert main([*base, "--strategy", "random", "--fraction", "0.1", "--out", str(out)]) == 0
    res = results_contract(out, "validate")
    assert res["weak_set"]["n"] == 15 and res["weak_set"]["weights"] is None and "strata" not in res["settings"]
    for flags in (["--strategy", "weak", "--correct-only"], ["--correct-only"]):  # the old flag: weak-correct
        out = tmp_path / "wc"
        assert main([*base, *flags, "--k", "5", "--out", str(out)]) == 0
        res = results_contract(out, "validate")
        assert res["settings"]["strategy"] == "weak-correct" and res["settings"]["correct_only"] is True
    assert main([*base, "--per-class", "--k", "10", "--out", str(out)]) == 0
    assert results_contract(out, "validate")["settings"]["strategy"] == "weak"
    out = tmp_path / "default"
    assert main([*base, "--out", str(out)]) == 0
    from robustest.cli.validate import DEFAULT_STRATEGY

    res = results_contract(out, "validate")
    assert res["settings"]["strategy"] == DEFAULT_STRATEGY
    if DEFAULT_STRATEGY in ("stratified", "random"):
        assert res["settings"]["k"] == 150 and res["weak_set"]["n"] == 150  # every sample: fewer than 1000
    capsys.readouterr()
    rc = main([*base, "--strategy", "stratified", "--correct-only", "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "--correct-only applies to --strategy weak or weak-correct, not stratified" in err
    with pytest.raises(SystemExit) as e:
        main([*base, "--strategy", "stratified", "--strata", "0", "--out", str(tmp_path / "bad")])
    assert e.value.code == 2 and "--strata" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([*base, "--strategy", "best", "--out", str(tmp_path / "bad")])
    assert e.value.code == 2 and "--strategy" in capsys.readouterr().err


def test_validate_help_names_the_default_strategy(capsys):
    from robustest.cli.validate import DEFAULT_STRATEGY

    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    out = capsys.readouterr().out
    assert "--strategy" in out and f"Default: {DEFAULT_STRATEGY}" in out and "--allocation" in out
    json.dumps(out)  # plain text
