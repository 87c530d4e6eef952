"""Test generation from Python (robustest.fuzzing.generate): what ``robustest generate`` runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from robustest.core.errors import ConfigError
from robustest.fuzzing.generate import (
    GeneratedTests,
    GenerateOptions,
    attack_kwargs,
    figures_of,
    generate_report,
    generate_tests,
    measure_fol,
    quantiles,
    save_examples,
)


def test_quantiles_are_exact_and_ignore_non_finite_values():
    q = quantiles(torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, float("nan")]))
    assert q == pytest.approx({"min": 0.0, "q05": 0.2, "q25": 1.0, "q50": 2.0, "q75": 3.0, "q95": 3.8, "max": 4.0,
                               "mean": 2.0})
    assert quantiles(torch.tensor([float("inf")])) is None


def test_attack_kwargs_resolve_defaults_and_refuse_what_the_attack_does_not_take():
    kw = attack_kwargs(GenerateOptions(method="pgd", norm="linf"), 0.1)
    assert kw["eps"] == 0.1 and kw["steps"] == 10 and kw["norm"] == "linf"
    assert attack_kwargs(GenerateOptions(method="pgd", steps=3, alpha=0.02), 0.1)["alpha"] == 0.02
    with pytest.raises(ConfigError, match="--alpha does not apply to fgsm"):
        attack_kwargs(GenerateOptions(method="fgsm", alpha=0.1), 0.1)
    with pytest.raises(ConfigError, match="not a threat model of fgsm"):
        attack_kwargs(GenerateOptions(method="fgsm", norm="l1"), 0.1)
    assert attack_kwargs(GenerateOptions(method="cw", norm="l2"), 0.3)["eps"] is None  # C&W: the bound as given


def test_test_figures_count_and_measure_the_perturbations():
    x0 = torch.zeros(2, 1, 2, 2)
    x = x0.clone()
    x[0, 0, 0, 0], x[1, 0, 1, 1] = 0.3, 0.4
    t = GeneratedTests(x, torch.tensor([1, 2]), torch.tensor([1, 0]), torch.tensor([5, 7]), x0, {}, {})
    f = figures_of(t, torch.tensor([0.5, 1.5]), "linf", 0.1)
    assert f["tests"] == 2 and f["tests_changed_prediction"] == 1
    assert f["perturbation"]["linf"]["min"] == pytest.approx(0.3)
    assert f["perturbation"]["l2"]["max"] == pytest.approx(0.4)
    assert f["fol"] == {"norm": "linf", "eps": 0.1, "quantiles": quantiles(torch.tensor([0.5, 1.5]))}
    empty = GeneratedTests(x[:0], torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                  torch.zeros(0, dtype=torch.long), x0[:0], {}, {})
    assert figures_of(empty, torch.empty(0), "l2", 0.1)["perturbation"] == {"linf": None, "l2": None}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))


def test_attack_tests_keep_the_successful_ones_or_all_and_fol_is_measured_against_the_seeds(tmp_path):
    torch.manual_seed(1)
    x, y = torch.rand(12, 1, 4, 4), torch.randint(0, 3, (12,))
    opts = GenerateOptions(method="pgd", steps=3)
    t = generate_tests(opts, _model(), (x, y), 12, 0.3, "linf", False)
    assert t.x.shape[0] == int(t.extra["success"].sum()) and torch.equal(t.x0, x[t.index])
    every = generate_tests(GenerateOptions(method="pgd", steps=3, keep_all=True), _model(), (x, y), 12, 0.3, "linf",
                           False)
    assert every.x.shape[0] == 12 and every.summary["kept"] == "all"
    fol_eps, fol = measure_fol(opts, _model(), every, 0.3, "linf")
    assert fol_eps == 0.3 and fol.shape == (12,) and bool((fol >= 0).all())
    grid = save_examples(tmp_path, 4, "pgd", every, fol, "linf")
    assert grid[:4] == b"\x89PNG" and (tmp_path / "examples.png").is_file() and (tmp_path / "fol_hist.png").is_file()


def test_the_report_names_the_method_and_the_figures():
    from robustest.results import document

    fol = torch.tensor([0.1, 0.2])
    doc = document("generate", {"dataset": "digits", "split": "train"},
                   {"seeds": 2, "tests": 2, "perturbation": {"linf": None, "l2": None},
                    "fol": {"norm": "linf", "eps": 0.1, "quantiles": quantiles(fol)}}, {"total_s": 1.0}, world_size=1)
    html = generate_report(doc, "pgd", None, fol).render()
    assert "robustest generate: pgd on digits (train)" in html and "FOL (linf, eps 0.1" in html


def test_threat_norm_is_the_given_one_else_the_attacks_first_else_linf():
    from robustest.fuzzing.generate import threat_norm

    assert threat_norm("pgd", "l2") == "l2"
    assert threat_norm("cw") == "l2" and threat_norm("pgd") == "linf"
    assert threat_norm("fol-fuzz") == "linf" and threat_norm("cov-fuzz") == "linf"


def test_default_eps_by_channels():
    from robustest.fuzzing.generate import default_eps

    assert default_eps(1) == 0.3 and default_eps(3) == 8 / 255 and default_eps(4) == 8 / 255


def test_check_radii_measures_each_radius_in_its_own_norm():
    GenerateOptions(method="pgd", eps=1.0, fol_eps=1.0).check_radii()  # L-inf radii up to 1 pass
    GenerateOptions(method="pgd", eps=None, fol_eps=None).check_radii()  # none given: the defaults apply later
    GenerateOptions(method="cw", norm="l2", eps=3.0).check_radii()  # an L2 radius may exceed 1
    GenerateOptions(method="pgd", eps=0.1, fol_eps=5.0).check_radii("l2")  # the FOL's norm decides its radius
    GenerateOptions(method="pgd", eps=0.1, fol_eps=-1.0).check_radii("gradnorm")  # gradnorm has no radius
    with pytest.raises(ConfigError, match="^eps"):
        GenerateOptions(method="pgd", eps=1.5).check_radii()
    with pytest.raises(ConfigError, match="^fol_eps"):
        GenerateOptions(method="pgd", eps=0.1, fol_eps=1.5).check_radii()
    with pytest.raises(ConfigError, match="^fol_eps"):
        GenerateOptions(method="cw", norm="l2", eps=3.0, fol_eps=3.0).check_radii("linf")
