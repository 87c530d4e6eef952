"""The regression gate's rules at their boundaries, without a model: the verdict rule (one-sided exact McNemar
p-value below alpha AND a drop larger than max_drop), when score strata are crossed with the classes, and the
Neyman allocation of the suite's samples."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from robustest.core.errors import ConfigError
from robustest.suite.build import MIN_PER_STRATUM, data_sha256, make_strata, stratified_draw
from robustest.suite.check import SuiteCheck, regressed
from robustest.suite.stats import Estimate, paired_difference


def five_broken(n: int = 40):
    """Baseline right on all n samples, the candidate wrong on 5 of them: b = 5, c = 0 in one stratum of n."""
    base = torch.ones(n, dtype=torch.bool)
    cand = base.clone()
    cand[:5] = False
    return paired_difference(base, cand, torch.zeros(n, dtype=torch.long), torch.tensor([n]))


def test_five_discordant_pairs_one_way_are_a_regression_at_alpha_five_percent():
    d = five_broken()
    assert (d.b, d.c) == (5, 0) and d.drop == 0.125
    assert d.p_value == 1 / 32 and d.p_two_sided == 1 / 16  # the two-sided p would let this regression pass
    assert regressed(d, 0.05, 0.0) is True
    assert regressed(d, 0.05, 0.124) is True


def test_the_verdict_rule_boundaries():
    d = five_broken()
    assert regressed(d, 0.05, 0.125) is False  # a drop of exactly max_drop passes
    assert regressed(d, 1 / 32, 0.0) is False  # p equal to alpha is not significant
    assert regressed(d, 1 / 32 + 1e-12, 0.0) is True
    better = paired_difference(torch.zeros(40, dtype=torch.bool), torch.ones(40, dtype=torch.bool),
                               torch.zeros(40, dtype=torch.long), torch.tensor([40]))
    assert better.drop == -1.0 and regressed(better, 0.999, -2.0) is False  # a better candidate is never significant


def test_classes_are_crossed_from_exactly_two_samples_per_cell():
    assert MIN_PER_STRATUM == 2
    order, labels = torch.arange(16), torch.arange(16) % 2  # 2 score bins x 2 classes = 4 cells of 4 samples
    stratum, desc, crossed = make_strata(order, labels, k=8, strata=2)
    assert crossed and len(desc) == 4 and torch.bincount(stratum).tolist() == [4, 4, 4, 4]
    assert desc[0] == {"bin": 0, "class": 0} and desc[3] == {"bin": 1, "class": 1}
    stratum, desc, crossed = make_strata(order, labels, k=7, strata=2)  # K = 2 x cells - 1: bins only
    assert not crossed and [d["class"] for d in desc] == [-1, -1] and torch.bincount(stratum).tolist() == [8, 8]
    with pytest.raises(ConfigError, match="cannot cross 2 score strata"):
        make_strata(order, labels, k=7, strata=2, by_class="yes")
    # a cell of one sample cannot be a stratum
    _, _, crossed = make_strata(torch.arange(5), torch.tensor([0, 0, 1, 1, 1]), k=20, strata=2)
    assert not crossed


class Analysis:
    def __init__(self, frac: list[float], clean: list[bool] | None = None) -> None:
        self.n = len(frac)
        self.label = torch.zeros(self.n, dtype=torch.long)
        self.frac_misclassified = torch.tensor(frac)
        self.clean_correct = torch.ones(self.n, dtype=torch.bool) if clean is None else torch.tensor(clean)

    def __len__(self) -> int:
        return self.n

    def order(self) -> torch.Tensor:
        return torch.arange(self.n)


def test_neyman_allocation_follows_the_strata_standard_deviations():
    # 4 strata of 10: pilot error rates 0.5, 0.1, 0, 0 -> N_h * sd_h = 5, 3, 0, 0; K = 16 with 2 per stratum at
    # least: ideal 10, 6, 0, 0 -> floors lift strata 3 and 4 to 2, the two largest give back 2 each in turn
    a = Analysis([0.5] * 10 + [0.1] * 10 + [0.0] * 20)
    picked, stratum, alloc, desc, crossed = stratified_draw(a, 16, strata=4, by_class="no", allocation="neyman")
    assert alloc.tolist() == [8, 4, 2, 2] and not crossed
    assert torch.bincount(stratum[picked], minlength=4).tolist() == [8, 4, 2, 2]
    assert picked.tolist() == sorted(set(picked.tolist()))
    prop = stratified_draw(a, 16, strata=4, by_class="no", allocation="proportional")[2]
    assert prop.tolist() == [4, 4, 4, 4]


def test_neyman_counts_a_clean_error_as_certain_failure():
    # stratum 0 misclassified clean (rate 1, sd 0) and stratum 1 at 0.5: every spare sample goes to stratum 1
    a = Analysis([0.0] * 10 + [0.5] * 10, clean=[False] * 10 + [True] * 10)
    alloc = stratified_draw(a, 12, strata=2, by_class="no", allocation="neyman")[2]
    assert alloc.tolist() == [2, 10]
    with pytest.raises(ConfigError, match="unknown allocation 'optimal'"):
        stratified_draw(a, 12, strata=2, by_class="no", allocation="optimal")


# ------------------------------------------------------------------------------------- the check's reporting
def est(value: float, lo: float, hi: float) -> Estimate:
    return Estimate(value, lo, hi, 0.01, 100.0, 38, 0.95)


def a_check(regression: bool | None, flags: list[dict] | None = None, accepted: tuple[str, ...] = ()) -> SuiteCheck:
    comparison = None if regression is None else five_broken()
    k = 40
    outcomes = {"clean": torch.ones(k, dtype=torch.bool), "robust": torch.ones(k, dtype=torch.bool)}
    return SuiteCheck(robust=est(0.875, 0.75, 0.95), clean=est(1.0, 0.9, 1.0), corruption=None,
                      baseline=None if regression is None else {"robust_accuracy": est(1.0, 0.9, 1.0)},
                      comparison=comparison, corruption_comparison=None, regression=regression, alpha=0.05,
                      max_drop=0.02, version="fast", baseline_source=None if regression is None else "stored",
                      outcomes=outcomes, baseline_outcomes=None, flags=flags or [], accepted_flags=accepted)


def test_repr_and_message_of_a_regression_name_the_figures():
    r = a_check(True)
    assert repr(r) == ("SuiteCheck(robust 87.5% [75.0, 95.0], version='fast', drop +12.5 points "
                       f"[{100 * r.comparison.ci_low:+.1f}, {100 * r.comparison.ci_high:+.1f}], McNemar p=0.0312, "
                       "REGRESSION)")
    m = r.message()
    assert m.startswith("REGRESSION: robust accuracy 87.5% (95% interval 75.0-95.0%) on 40 suite samples, "
                        "baseline 100.0%; drop +12.5 points")
    assert "5 samples broken only by the candidate, 0 only by the baseline" in m
    assert m.endswith("the drop is significant (exact McNemar p = 0.0312 < alpha 0.05) and larger than max_drop "
                      "2.0 points")
    assert r.verdict == "regression" and r.failed is True
    d = r.to_dict()
    assert d["verdict"] == "regression" and d["failed"] is True and d["comparison"]["b"] == 5
    assert d["estimate"]["robust_accuracy"] == 0.875 and d["baseline"]["robust_accuracy"]["value"] == 1.0


def test_pass_no_baseline_and_unreliable_verdicts():
    ok = a_check(False)
    assert ok.verdict == "pass" and ok.failed is False and repr(ok).endswith(", pass)")
    assert ok.message().startswith("no regression: ")
    assert ok.message().endswith("the drop is significant (p = 0.0312) but not larger than max_drop 2.0 points")
    none = a_check(None)
    assert none.verdict == "no baseline" and none.failed is False
    assert repr(none) == "SuiteCheck(robust 87.5% [75.0, 95.0], version='fast')"
    assert none.message() == ("robust accuracy 87.5% (95% interval 75.0-95.0%) on 40 suite samples; no baseline "
                              "to compare with")
    flags = [{"name": "gradient_masking", "severity": "unreliable"}, {"name": "gradient_masking",
             "severity": "unreliable"}, {"name": "slow", "severity": "warning"}]
    bad = a_check(False, flags)
    assert bad.blocking_flags == ["gradient_masking"] and bad.verdict == "unreliable" and bad.failed is True
    assert "UNRELIABLE: the evaluation is flagged gradient_masking" in bad.message()
    fine = a_check(False, flags, accepted=("gradient_masking",))
    assert fine.blocking_flags == [] and fine.verdict == "pass" and fine.failed is False


def test_gate_lines_say_each_flag_and_why_the_gate_failed():
    assert a_check(False).gate_lines() == [] and a_check(None).gate_lines() == []
    drop = a_check(True).gate_lines()
    assert drop == ["robust accuracy dropped by 12.5 points (McNemar p = 0.0312 < 0.05, more than --max-drop 2.0 "
                    "points): regression"]
    flag = {"name": "gradient_masking", "severity": "unreliable", "message": "PGD beats APGD", "remedy": "look"}
    bad = a_check(False, [flag, {**flag, "model": "baseline"}])
    assert bad.gate_lines() == [
        "flag unreliable gradient_masking: PGD beats APGD (remedy: look)",
        "baseline flag unreliable gradient_masking: PGD beats APGD (remedy: look)",
        "gate failed: the evaluation is flagged unreliable (gradient_masking); fix the cause, or accept with "
        "--accept-flag NAME"]
    assert a_check(False, [flag], accepted=("gradient_masking",)).gate_lines() == [bad.gate_lines()[0]]
    both = a_check(True, [flag])  # a regression is the reason given, not the flag
    assert both.gate_lines()[1:] == drop
    two = a_check(False, [flag, {**flag, "name": "zero_gradients"}])
    assert two.gate_lines()[-1].startswith("gate failed: the evaluation is flagged unreliable (gradient_masking, "
                                           "zero_gradients); ")
    kept = dataclasses.replace(a_check(False), certified_regression=False, certified_comparison=five_broken())
    assert kept.gate_lines() == []  # certificates compared, none lost beyond the rule: nothing to say
    cert = dataclasses.replace(a_check(False), certified_regression=True, certified_comparison=five_broken())
    assert cert.gate_lines() == ["5 samples certified by the baseline lost their certificate; certified accuracy "
                                 "dropped by 12.5 points (McNemar p = 0.0312 < 0.05, more than --max-drop 2.0 points): "
                                 "regression"]


def test_data_sha256_is_the_hash_of_the_images_labels_and_count_whatever_the_batching():
    import hashlib

    x = torch.linspace(0, 1, 5 * 4).reshape(5, 1, 2, 2)
    y = torch.tensor([0, 1, 2, 1, 0])
    want = hashlib.sha256(x.numpy().tobytes() + y.numpy().astype("int64").tobytes())
    assert data_sha256((x, y), batch_size=5) != want.hexdigest()  # the count is part of the hash
    want.update(b"n=5")
    assert data_sha256((x, y), batch_size=5) == want.hexdigest()
    # streamed in batches of 2: images and labels interleave per batch
    h = hashlib.sha256()
    for s in range(0, 5, 2):
        h.update(x[s:s + 2].numpy().tobytes())
        h.update(y[s:s + 2].numpy().astype("int64").tobytes())
    h.update(b"n=5")
    assert data_sha256((x, y), batch_size=2) == h.hexdigest()
    assert data_sha256(x, batch_size=5) == hashlib.sha256(x.numpy().tobytes() + b"n=5").hexdigest()


def test_images_on_the_255_grid_are_stored_as_bytes_and_others_as_floats():
    from robustest.suite.build import _as_stored

    grid = torch.tensor([0, 1, 128, 254, 255], dtype=torch.float32).reshape(1, 1, 1, 5) / 255.0
    stored = _as_stored(grid)
    assert stored.dtype == torch.uint8 and stored.flatten().tolist() == [0, 1, 128, 254, 255]
    off = grid.clone()
    off[0, 0, 0, 2] = 0.5  # 127.5 / 255: not on the grid
    kept = _as_stored(off)
    assert kept.dtype == torch.float32 and torch.equal(kept, off)


def test_fewer_than_four_samples_make_one_stratum():
    stratum, desc, _ = make_strata(torch.arange(10), torch.zeros(10, dtype=torch.long), k=3, strata=4, by_class="no")
    assert len(desc) == 1 and stratum.tolist() == [0] * 10
    stratum, desc, _ = make_strata(torch.arange(10), torch.zeros(10, dtype=torch.long), k=4, strata=4, by_class="no")
    assert len(desc) == 2 and stratum.tolist() == [0] * 5 + [1] * 5


def test_build_checks_the_number_of_targets_before_any_work(monkeypatch):
    from robustest.suite import build as build_mod

    def no_work(*a, **k):
        raise AssertionError("analysed before the settings were checked")

    monkeypatch.setattr(build_mod, "num_samples", no_work)  # the first look at the data
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    data = (torch.rand(8, 1, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]))
    with pytest.raises(ConfigError, match="n_targets"):
        build_mod.build_suite(model, data, 0.1, k=4, n_targets=0)


def test_corruption_outcomes_are_right_predictions_on_the_corrupted_images():
    from robustest.corruptions import corrupt
    from robustest.suite.build import evaluate_outcomes

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3)).eval()
    x, y = torch.rand(10, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    attack = {"eps": 0.05, "norm": "linf", "version": "fast", "seed": 0, "batch_size": 4}
    corruption = {"seed": 7, "settings": [["gaussian_noise", 5], ["brightness", 1]]}
    out = evaluate_outcomes(model, x, y, attack, corruption)
    with torch.no_grad():
        for j, (name, sev) in enumerate(corruption["settings"]):
            want = torch.cat([model(corrupt(x[s:s + 4], name, sev, seed=7 + s)).argmax(1) == y[s:s + 4]
                              for s in range(0, 10, 4)])
            assert torch.equal(out["corruption"][:, j], want), name
    assert out["corruption"].shape == (10, 2) and out["clean"].tolist() == (model(x).argmax(1) == y).tolist()


def test_clopper_pearson_at_the_ends():
    from robustest.suite.stats import _clopper_pearson

    lo, hi = _clopper_pearson(0.0, 10.0, 0.05)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 10))
    lo, hi = _clopper_pearson(1.0, 10.0, 0.05)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 10))


def certified_check(regression: bool | None, cert_regression: bool | None, with_baseline: bool = True) -> SuiteCheck:
    """A check of a suite with certificates: candidate certified 50 %, baseline 62.5 %, 5 certificates lost."""
    from dataclasses import replace

    r = a_check(regression)
    r.certified = est(0.5, 0.35, 0.65)
    if with_baseline:
        r.baseline = {"robust_accuracy": est(1.0, 0.9, 1.0), "certified_accuracy": est(0.625, 0.5, 0.75)}
        r.certified_comparison = replace(five_broken(), c=1)
        r.certified_regression = cert_regression
    r.corruption = est(0.8, 0.7, 0.9)
    r.corruption_comparison = replace(five_broken(), b=2)
    return r


def test_the_certified_part_of_the_message_and_results():
    r = certified_check(False, True)
    c = r.certified_comparison
    assert r.message().endswith(
        "; CERTIFIED REGRESSION: certified accuracy 50.0%, baseline 62.5%; 5 samples certified by the baseline lost "
        f"their certificate, 1 gained one (drop {100 * c.drop:+.1f} points, McNemar p = {c.p_value:.3g})")
    assert r.verdict == "regression" and r.failed is True  # a certified regression alone fails the gate
    d = r.to_dict()
    assert d["certified"] == {**est(0.5, 0.35, 0.65).to_dict(), "certified_accuracy": 0.5}
    assert d["certified_regression"] is True and d["lost_certificates"] == 5
    assert d["certified_comparison"] == c.to_dict() and d["corruption_comparison"]["b"] == 2
    assert d["corruption"] == {**est(0.8, 0.7, 0.9).to_dict(), "corruption_accuracy": 0.8}
    assert d["clean"] == est(1.0, 0.9, 1.0).to_dict() and d["alpha"] == 0.05 and d["max_drop"] == 0.02
    assert (d["attack_version"], d["baseline_source"], d["regression"]) == ("fast", "stored", False)
    assert d["flags"] == [] and d["accepted_flags"] == [] and d["blocking_flags"] == []
    kept = certified_check(False, False)
    assert "; no certified regression: certified accuracy 50.0%, baseline 62.5%; " in kept.message()
    assert kept.verdict == "pass" and kept.failed is False
    alone = certified_check(None, None, with_baseline=False)
    assert alone.message().endswith("; no baseline to compare with; certified accuracy 50.0%")
    d = alone.to_dict()
    assert d["certified_regression"] is None and "certified_comparison" not in d and "lost_certificates" not in d
    assert "baseline" not in d and "comparison" not in d
    plain = a_check(False).to_dict()
    assert "certified" not in plain and "certified_regression" not in plain and "corruption" not in plain


def test_a_message_with_a_p_value_at_alpha_says_it_is_not_below():
    from dataclasses import replace

    r = a_check(False)
    r.comparison = replace(r.comparison, p_value=0.05)
    assert r.message().endswith("McNemar p = 0.05 is not below alpha 0.05")
    r.baseline = None
    assert "baseline nan%" in r.message()


def test_an_evaluated_baseline_adds_its_flags_and_its_time(monkeypatch):
    """check_suite with a baseline model the suite did not store: both evaluations' flags (the baseline's marked),
    the outcomes compared pairwise, the baseline's own timing; an unaccepted unreliable flag of the baseline fails."""
    from robustest.suite import check as check_mod
    from suite.test_reading import make_suite

    k = 4
    calls = []

    def fake(model, x, y, attack, corruption, progress=False, certify=None):
        calls.append((model, attack["version"], certify))
        mine = model is candidate
        return {"clean": torch.ones(k, dtype=torch.bool),
                "robust": torch.tensor([True, False, True, False] if mine else [True] * k),
                "corruption": torch.zeros(k, 0, dtype=torch.bool), "seconds": {"attack_s": 1.0},
                "flags": [{"name": "randomised", "severity": "warning"}] if mine else
                [{"name": "zero-gradient", "severity": "unreliable"}]}

    monkeypatch.setattr(check_mod, "evaluate_outcomes", fake)
    torch.manual_seed(0)
    candidate = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    baseline = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    r = check_mod.check_suite(candidate, make_suite(k=k), baseline, max_drop=0.0)
    assert [c[0] is candidate for c in calls] == [True, False] and {c[1] for c in calls} == {"fast"}
    assert r.baseline_source == "evaluated"
    assert r.flags == [{"name": "randomised", "severity": "warning"},
                       {"name": "zero-gradient", "severity": "unreliable", "model": "baseline"}]
    assert r.blocking_flags == ["zero-gradient"] and r.verdict == "unreliable" and r.failed
    assert set(r.timings) == {"candidate_attack_s", "baseline_s", "total_s"} and r.timings["candidate_attack_s"] == 1.0
    assert (r.comparison.b, r.comparison.c) == (2, 0) and r.baseline_outcomes["robust"].all()
    calls.clear()
    accepted = check_mod.check_suite(candidate, make_suite(k=k), baseline, accept_flags="zero-gradient")
    assert accepted.blocking_flags == [] and accepted.accepted_flags == ("zero-gradient",)
    calls.clear()
    own = check_mod.check_suite(candidate, make_suite(k=k), False)
    assert len(calls) == 1 and own.baseline_source is None and own.comparison is None and own.regression is None
    assert own.flags == [{"name": "randomised", "severity": "warning"}] and "baseline_s" not in own.timings


def test_the_library_defaults_are_the_documented_ones():
    """docs/SUITE.md: K 100, 20 neighbours of uniform noise 0.5, 4 strata, proportional allocation, the standard
    ensemble, alpha 0.05 and max_drop 0.02; the CLI's flags say the same (tests/suite/test_suite.py)."""
    import inspect

    from robustest.suite import build_suite, check_suite
    from robustest.suite.check import DEFAULT_ALPHA, DEFAULT_MAX_DROP

    def defaults(fn):
        return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}

    assert defaults(build_suite) == {
        "k": 100, "norm": "linf", "version": "standard", "n_targets": None, "corruptions": None,
        "severities": (1, 2, 3, 4, 5), "strata": 4, "by_class": "auto", "allocation": "proportional",
        "n_neighbors": 20, "noise_eps": 0.5, "seed": 0, "batch_size": 256, "dataset": None, "split": None,
        "certify": None, "progress": False}
    assert defaults(check_suite) == {"baseline": None, "alpha": 0.05, "max_drop": 0.02, "version": None,
                                     "level": 0.95, "progress": False, "accept_flags": ()}
    assert (DEFAULT_ALPHA, DEFAULT_MAX_DROP) == (0.05, 0.02)


def test_a_population_taken_whole_is_an_exact_estimate_at_the_asked_level():
    from robustest.suite.stats import stratified_estimate

    # two strata of 2 samples, each taken whole (n_h = N_h): no sampling variance
    e = stratified_estimate(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]), torch.tensor([2, 2]),
                            level=0.9)
    assert (e.value, e.ci_low, e.ci_high, e.std_error, e.n_eff, e.df, e.level) == (0.75, 0.75, 0.75, 0.0, math.inf,
                                                                                     2, 0.9)


def test_build_runs_with_the_documented_defaults(monkeypatch):
    """The defaults as the build uses them: K 100 drawn in 4 strata (auto by class, proportional, seed 0) from an
    analysis of 20 neighbours at noise 0.5, attacked with the standard ensemble in batches of 256, every severity
    of a corruption asked for."""
    import robustest.weakrobust as weakrobust
    from robustest.suite import build as build_mod

    seen = {}

    class Stop(Exception):
        pass

    def analyze(model, data, **kw):
        seen["analyze"] = kw
        return type("An", (), {"index": torch.arange(200)})()

    def draw(analysis, k, strata, by_class, allocation, seed):
        seen["draw"] = (k, strata, by_class, allocation, seed)
        return torch.arange(4), torch.zeros(200, dtype=torch.long), torch.tensor([4]), [{"n": 200}], False

    def outcomes(model, x, y, attack, corruption, progress=False, certify=None):
        seen["attack"], seen["corruption"], seen["certify"] = attack, corruption, certify
        raise Stop

    monkeypatch.setattr(weakrobust, "analyze", analyze)
    monkeypatch.setattr(build_mod, "stratified_draw", draw)
    monkeypatch.setattr(build_mod, "evaluate_outcomes", outcomes)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    data = (torch.rand(200, 1, 2, 2), torch.arange(200) % 3)
    with pytest.raises(Stop):
        build_mod.build_suite(model, data, 0.1, corruptions=["gaussian_noise"])
    assert seen["draw"] == (100, 4, "auto", "proportional", 0)
    assert seen["analyze"] == {"n_neighbors": 20, "eps": 0.5, "seed": 0, "progress": False}
    assert seen["attack"] == {"eps": 0.1, "norm": "linf", "version": "standard", "n_targets": None, "seed": 0,
                              "batch_size": 256}
    assert seen["corruption"] == {"settings": [["gaussian_noise", s] for s in (1, 2, 3, 4, 5)], "seed": 0}
    assert seen["certify"] is None


def test_a_certified_build_stores_the_certificates_and_their_estimate(monkeypatch):
    from robustest.suite import build as build_mod
    from robustest.suite.stats import stratified_estimate

    def outcomes(model, x, y, attack, corruption, progress=False, certify=None):
        assert certify == {"method": "ibp"}
        k = len(y)
        return {"clean": torch.ones(k, dtype=torch.bool), "robust": torch.ones(k, dtype=torch.bool),
                "corruption": torch.zeros(k, 0, dtype=torch.bool), "certified": torch.arange(k) % 4 == 0,
                "seconds": {}, "flags": []}

    monkeypatch.setattr(build_mod, "evaluate_outcomes", outcomes)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    data = (torch.rand(40, 1, 2, 2), torch.arange(40) % 3)
    suite = build_mod.build_suite(model, data, 0.1, k=8, strata=2, certify="ibp")
    assert torch.equal(suite.certified, torch.arange(8) % 4 == 0) and suite.meta["certify"] == {"method": "ibp"}
    expected = stratified_estimate((torch.arange(8) % 4 == 0).float(), suite.stratum, suite.sizes).to_dict()
    assert suite.meta["baseline"]["certified_accuracy"] == expected
    assert expected["value"] != suite.meta["baseline"]["robust_accuracy"]["value"]  # not the robust figure


def test_a_perfect_anticorrelation_is_exactly_minus_one_despite_rounding():
    """The weighted phi coefficient of y = 1 - x rounds to -1.0000000000000002 with these weights; it is clamped to
    [-1, 1] (a correlation never lies outside it)."""
    from robustest.suite import stats

    x = torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64)
    w = torch.tensor([0.2829006982750252, 0.49976685767296025, 0.6176780266613774], dtype=torch.float64)
    assert stats._weighted_correlation(x, 1 - x, w) == -1.0
    assert stats._weighted_correlation(x, x, w) == 1.0
    assert stats._weighted_correlation(x, torch.ones(3, dtype=torch.float64), w) == 0.0  # constant: 0


def test_outcome_estimates_weight_each_stratum_by_its_population():
    """Strata of 10 and 30 samples in the population, two suite samples each: robust 1/2 and 2/2 -> 0.875."""
    from robustest.suite.stats import outcome_estimates

    stratum, sizes = torch.tensor([0, 0, 1, 1]), torch.tensor([10, 30])
    out = {"robust": torch.tensor([True, False, True, True]), "clean": torch.ones(4, dtype=torch.bool),
           "corruption": torch.zeros(4, 0, dtype=torch.bool)}
    est = outcome_estimates(out, stratum, sizes)
    assert list(est) == ["robust_accuracy", "clean_accuracy"]
    assert est["robust_accuracy"].value == pytest.approx(0.875) and est["clean_accuracy"].value == 1.0
    out["corruption"] = torch.tensor([[True, False], [True, True], [False, False], [True, False]])
    out["certified"] = torch.tensor([False, False, True, False])
    est = outcome_estimates(out, stratum, sizes, level=0.9)
    # corruption: per-sample means 0.5, 1, 0, 0.5 -> strata 0.75 and 0.25 -> (10 * 0.75 + 30 * 0.25) / 40
    assert est["corruption_accuracy"].value == pytest.approx(0.375)
    assert est["certified_accuracy"].value == pytest.approx(30 * 0.5 / 40)
    assert {name: e.level for name, e in est.items()} == dict.fromkeys(est, 0.9)  # every interval at the level
    assert list(est) == ["robust_accuracy", "clean_accuracy", "corruption_accuracy", "certified_accuracy"]
