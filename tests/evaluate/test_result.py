"""The evaluation's result object and its curve bookkeeping (``robustest.evaluate.ensemble``) on hand-built
results: the RobustBench entry, the results contract's derived figures, and how a curve merges each radius's
evaluation of the survivors (outcomes, per-attack shares, summed timings)."""

from __future__ import annotations

import math

import pytest
import torch

from robustest.evaluate.ensemble import EvalResult, _curve_point, _merge, _remapped
from robustest.evaluate.flags import Flag


def result(n: int = 4, *, version: str = "standard", robust=(True, True, False, True), flags=(), **kw) -> EvalResult:
    """A result of ``n`` samples: sample 2 broken by apgd-ce at L-inf 0.1 (labels 0..n-1, clean all correct)."""
    robust_t = torch.tensor(robust[:n], dtype=torch.bool)
    y = torch.arange(n)
    adv_pred = torch.where(robust_t, y, (y + 1) % n)
    fields = {
        "eps": 0.1, "norm": "linf", "version": version, "clean_accuracy": 1.0,
        "robust_accuracy": float(robust_t.double().mean()), "attacks": {"apgd-ce": 0.75},
        "breaks": {"apgd-ce": int((~robust_t).sum())}, "attacked": {"apgd-ce": n},
        "index": torch.arange(n), "y": y, "clean_pred": y.clone(), "adv_pred": adv_pred,
        "clean_correct": torch.ones(n, dtype=torch.bool), "robust": robust_t,
        "broken_by": ["" if r else "apgd-ce" for r in robust[:n]],
        "linf": torch.where(robust_t, 0.0, 0.1).float(), "l2": torch.where(robust_t, 0.0, 0.5).float(),
        "flags": list(flags), "forwards": 3,
    }
    fields.update(kw)
    return EvalResult(**fields)


UNRELIABLE = Flag("zero-gradient", "unreliable", "m", "r")
WARNING = Flag("randomised", "warning", "m", "r")


@pytest.mark.parametrize("version, flags, expected", [
    ("standard", (), "75.00"),
    ("rand", (), "75.00"),
    ("rand", (WARNING,), "75.00"),           # a warning does not withhold the figure
    ("standard", (UNRELIABLE,), None),       # an unreliable evaluation is no AutoAttack figure
    ("fast", (), None),
    ("plus", (), None),
    ("auto", (), None),
])
def test_the_robustbench_entry_carries_autoattack_accuracy_only_for_autoattacks_versions(version, flags, expected):
    entry = result(version=version, flags=flags).robustbench()
    assert entry == {"link": None, "name": None, "authors": None, "additional_data": None,
                     "number_forward_passes": 3, "dataset": None, "venue": None, "architecture": None,
                     "eps": "0.1", "clean_acc": "100.00", "reported": None, "autoattack_acc": expected}


def test_the_robustbench_entry_adds_corruptions_and_the_callers_fields():
    r = result(corruption={"mean_corruption_accuracy": 0.91234, "mce": 0.8})
    entry = r.robustbench(name="mine", dataset="mnist", eps="0.3")
    assert entry["corruptions_acc"] == "91.23" and entry["corruptions_mce"] == "80.00"
    assert (entry["name"], entry["dataset"], entry["eps"]) == ("mine", "mnist", "0.3")  # info wins
    r = result(corruption={"mean_corruption_accuracy": 0.5})
    entry = r.robustbench()
    assert entry["corruptions_acc"] == "50.00" and entry["corruptions_mce"] is None
    assert "corruptions_acc" not in result().robustbench() and "corruptions_mce" not in result().robustbench()


def test_the_results_contract_derives_its_figures_from_the_outcomes():
    r = result(robust=(True, False, False, True), breaks={"apgd-ce": 1, "apgd-t": 3},
               clean_correct=torch.tensor([True, True, True, False]), timings={"clean_s": 1.5},
               settings={"steps": 7}, probe={"classes": 4})
    r.linf = torch.tensor([0.0, 0.05, 0.1, 0.2])
    d = r.to_dict()
    assert (d["format"], d["version"], d["world_size"], d["threat_model"], d["norm"]) == \
        ("robustest-eval-results", 1, 1, "Linf", "linf")
    assert d["share_of_breaks"] == {"apgd-ce": 0.25, "apgd-t": 0.75}
    assert d["misclassified_clean"] == 1 and d["num_samples"] == 4 and d["ensemble"] == "standard"
    # the perturbations of the broken samples that were correct: 0.05 and 0.1 (sample 3 was wrong already)
    assert d["perturbation"] == pytest.approx({"mean": 0.075, "median": 0.05, "max": 0.1})
    assert d["plan"] == "standard" and d["forwards"] == 3 and d["reliable"] is True and d["flags"] == []
    assert d["timings"] == {"clean_s": 1.5} and d["settings"] == {"steps": 7} and d["probe"] == {"classes": 4}
    assert "curve" not in d and "corruptions" not in d
    r.plan, r.norm = "fast-plan", "l2"
    r.l2 = torch.tensor([0.0, 0.5, 1.5, 3.0])
    d = r.to_dict()
    assert d["plan"] == "fast-plan" and d["threat_model"] == "L2" and d["perturbation"]["max"] == 1.5
    zero = result(breaks={"apgd-ce": 0, "apgd-t": 0}).to_dict()
    assert zero["share_of_breaks"] == {"apgd-ce": 0.0, "apgd-t": 0.0}
    corr = result(corruption={"mean_corruption_accuracy": 0.5, "result": object(), "baseline_result": object(),
                              "mce": None}).to_dict()
    assert corr["corruptions"] == {"mean_corruption_accuracy": 0.5, "mce": None}


def test_rows_name_each_samples_flags_and_breaking_radius():
    flag_a = Flag("zero-gradient", "unreliable", "m", "r", (2,))
    flag_b = Flag("randomised", "warning", "m", "r", (2, 3))
    r = result(flags=(flag_a, flag_b), gradient=["ok", "ok", "zero", "ok"])
    rows = r.rows()
    assert [row["flags"] for row in rows] == ["", "", "zero-gradient+randomised", "randomised"]
    assert rows[2] == {"index": 2, "label": 2, "clean_pred": 2, "clean_correct": 1, "adv_pred": 3, "robust": 0,
                       "broken_by": "apgd-ce", "linf": pytest.approx(0.1), "l2": 0.5, "gradient": "zero",
                       "flags": "zero-gradient+randomised"}
    assert "broken_at_eps" not in rows[0] and result().rows()[0]["gradient"] == ""
    r.broken_at = torch.tensor([float("nan"), 0.3, 0.1, 0.0], dtype=torch.float64)
    assert [row["broken_at_eps"] for row in r.rows()] == [None, 0.3, 0.1, 0.0]


def test_a_curve_point_counts_what_the_radius_broke():
    sub = result(robust=(True, False, False, True), timings={"total_s": 2.5, "clean_s": 1.0}, flags=(WARNING,))
    sub.plan = "p"
    point = _curve_point(sub, 0.2, 10, 4)
    assert point == {"eps": 0.2, "robust_accuracy": 0.2, "attacked": 4, "broke": 2, "plan": "p", "reliable": True,
                     "flags": [WARNING.to_dict()], "seconds": 2.5}
    assert math.isnan(_curve_point(result(n=0, robust=()), 0.2, 0, 0)["robust_accuracy"])
    assert _curve_point(result(), 0.2, 4, 4)["seconds"] == 0.0


def test_merging_a_larger_radius_writes_the_survivors_outcomes_and_sums_timings():
    res = result(robust=(True, True, False, True), timings={"apgd-ce_s": 1.0, "clean_s": 0.5, "total_s": 9.0})
    res.adv = torch.zeros(4, 1, 1, 1)
    pos = torch.tensor([0, 1, 3])  # the survivors of the smaller radius
    sub = result(n=3, robust=(False, True, False), attacks={"apgd-ce": 1 / 3, "apgd-t": 1 / 3},
                 breaks={"apgd-ce": 1, "apgd-t": 1}, attacked={"apgd-ce": 3, "apgd-t": 2},
                 timings={"apgd-ce_s": 2.0, "apgd-t_s": 0.25, "total_s": 3.0},
                 broken_by=["apgd-t", "", "apgd-ce"])
    sub.adv_pred = torch.tensor([7, 1, 8])
    sub.linf, sub.l2 = torch.tensor([0.2, 0.0, 0.3]), torch.tensor([1.0, 0.0, 2.0])
    sub.adv = torch.full((3, 1, 1, 1), 5.0)
    sub.plan = "larger"
    broken_at = torch.tensor([float("nan"), float("nan"), 0.1, float("nan")], dtype=torch.float64)
    _merge(res, sub, pos, 0.3, broken_at, 4)
    assert res.robust.tolist() == [False, True, False, False]
    assert torch.equal(broken_at.nan_to_num(-1), torch.tensor([0.3, -1, 0.1, 0.3], dtype=torch.float64))
    assert res.adv_pred.tolist() == [7, 1, 3, 8] and res.broken_by == ["apgd-t", "", "apgd-ce", "apgd-ce"]
    assert res.linf.tolist() == pytest.approx([0.2, 0.0, 0.1, 0.3]) and res.l2.tolist() == [1.0, 0.0, 0.5, 2.0]
    assert res.adv.flatten().tolist() == [5.0, 0.0, 0.0, 5.0]
    assert res.attacks == pytest.approx({"apgd-ce": 0.25, "apgd-t": 0.25})  # shares of all 4 samples: 1/3 * 3/4
    assert res.breaks == {"apgd-ce": 1, "apgd-t": 1} and res.attacked == {"apgd-ce": 3, "apgd-t": 2}
    assert res.plan == "larger"
    assert res.timings == {"apgd-ce_s": 3.0, "clean_s": 0.5, "total_s": 9.0, "apgd-t_s": 0.25}


def test_flags_of_a_subset_name_the_whole_sets_samples_and_the_radius():
    f = Flag("zero-gradient", "unreliable", "zero gradient", "fix", (0, 2))
    (g,) = _remapped([f], torch.tensor([5, 7, 9]), 0.25)
    assert g == Flag("zero-gradient", "unreliable", "eps 0.25: zero gradient", "fix", (5, 9))


@pytest.mark.parametrize("radii", [[0.1], [0.1, 0.2]])
def test_a_curve_prefixes_its_flags_with_the_radius_only_when_there_are_several(monkeypatch, radii):
    from robustest.evaluate import ensemble

    def fake(model, data, eps, **kw):
        x, _ = data
        r = result(n=len(x), robust=(True,) * len(x), flags=(Flag("randomised", "warning", "m", "r", (0,)),))
        r.eps = eps
        return r

    monkeypatch.setattr(ensemble, "evaluate", fake)
    x, y = torch.zeros(4, 1, 2, 2), torch.arange(4)
    res = ensemble._evaluate_curve(torch.nn.Identity(), (x, y), radii, {"norm": "linf"}, {})
    if len(radii) == 1:
        assert [f.message for f in res.flags] == ["m"]
    else:
        assert [f.message for f in res.flags] == ["eps 0.1: m", "eps 0.2: m"]
    assert [p["eps"] for p in res.curve] == radii and res.settings["eps"] == radii
