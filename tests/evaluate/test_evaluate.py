"""Tests of robustest.evaluate.evaluate (the AutoAttack-style ensemble), its result and the autoattack option
of robustest.evaluate.measure."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json

import pytest
import torch

from robustest import attacks
from robustest import evaluate as ev
from robustest.core.errors import ConfigError, DataError

SMALL = [("apgd-ce", {"steps": 10}), ("apgd-t", {"steps": 10, "n_targets": 2}), ("fab-t", {"steps": 10,
                                                                                       "n_targets": 2}),
         ("square", {"queries": 100})]


pytestmark = pytest.mark.usefixtures("one_thread")  # two shared cores: one intra-op thread


@pytest.fixture
def xy(digits_test):
    x, y = digits_test.tensors
    return x[:60].clone(), y[:60].clone()


def test_plans():
    std = ev.ensemble_plan("standard", "linf", num_classes=10)
    assert [p[0] for p in std] == ["apgd-ce", "apgd-t", "fab-t", "square"]
    assert [p[1] for p in std] == ["apgd", "apgd_t", "fab_t", "square"]
    assert std[0][2]["steps"] == 100 and std[1][2]["n_targets"] == 9 and std[2][2]["n_targets"] == 9
    assert std[3][2]["queries"] == 5000 and std[3][2]["p_init"] == 0.8
    assert all(p[2]["norm"] == "linf" for p in std)
    assert std[0][2]["stop_on_success"] and std[1][2]["stop_on_success"] and std[2][2]["stop_on_success"]
    # fewer classes: at most classes - 1 targets; APGD-T left out below 4 classes
    five = ev.ensemble_plan("standard", "l2", num_classes=5)
    assert five[1][2]["n_targets"] == 4 and all(p[2]["norm"] == "l2" for p in five)
    three = ev.ensemble_plan("standard", "linf", num_classes=3)
    assert [p[0] for p in three] == ["apgd-ce", "fab-t", "square"]
    fast = ev.ensemble_plan("fast", "linf", num_classes=10)
    assert [p[0] for p in fast] == ["apgd-ce", "apgd-t"] and fast[1][2]["n_targets"] == 3
    custom = ev.ensemble_plan("custom", "linf", ["apgd_dlr", ("pgd", {"steps": 7}), "BIM"])
    assert [p[0] for p in custom] == ["apgd-dlr", "pgd", "bim"] and custom[1][2]["steps"] == 7


@pytest.mark.parametrize(("kw", "match"), [
    ({"version": "plus"}, "unknown version"),
    ({"version": "standard", "attacks": ["square"]}, "version='custom'"),
    ({"version": "custom"}, "needs attacks"),
    ({"version": "custom", "attacks": ["nope"]}, "unknown attack"),
    ({"version": "custom", "attacks": ["bim"], "norm": "l2"}, "L-inf only"),
    ({"version": "custom", "attacks": [("pgd", {"eps": 3})]}, "does not take"),
    ({"version": "custom", "attacks": ["square", "square"]}, "listed twice"),
    ({"n_targets": 10}, "at most 9"),
    ({"n_targets": 0}, "positive integer"),
])
def test_plan_bad_input(kw, match):
    with pytest.raises(ConfigError, match=match):
        ev.ensemble_plan(kw.pop("version", "standard"), kw.pop("norm", "linf"), kw.pop("attacks", None),
                                 num_classes=10, **kw)


def test_bad_input_found_before_any_work(trained_digits_model, xy):
    calls = []
    spy = dataclasses.replace(attacks.get("apgd"), fn=lambda *a, **k: calls.append(1))
    m = trained_digits_model
    with attacks.registered(spy, replace=True):
        for eps in (0, -0.1, 1.5, float("nan"), "x"):
            with pytest.raises(ConfigError, match="eps"):
                ev.evaluate(m, xy, eps)
        with pytest.raises(ConfigError, match="norm"):
            ev.evaluate(m, xy, 0.1, norm="l7")
        with pytest.raises(ConfigError, match="version"):
            ev.evaluate(m, xy, 0.1, version="plus")
        with pytest.raises(ConfigError, match="n_targets"):
            ev.evaluate(m, xy, 0.1, n_targets=10)
        with pytest.raises(DataError, match="labels"):
            ev.evaluate(m, xy[0], 0.1)
        with pytest.raises(ConfigError, match="baseline"):
            ev.evaluate(m, xy, 0.1, baseline=m)
        with pytest.raises(ConfigError, match="severities"):
            ev.evaluate(m, xy, 0.1, corruptions="fog", severities=(0,))
        single = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 1))
        with pytest.raises(ConfigError, match="at least 2 classes"):
            ev.evaluate(single, (xy[0], torch.zeros(60, dtype=torch.long)), 0.1)
    assert calls == []


def test_ensemble_bookkeeping(trained_digits_model, xy):
    x, y = xy
    m = trained_digits_model
    r = ev.evaluate(m, (x, y), 0.1, version="custom", attacks=SMALL, seed=0, keep_adv=True, batch_size=16)
    n = x.shape[0]
    assert r.num_samples == n and list(r.attacks) == ["apgd-ce", "apgd-t", "fab-t", "square"]
    with torch.no_grad():
        clean = m(x).argmax(1)
        adv_pred = m(r.adv).argmax(1)
    assert torch.equal(r.clean_correct, clean == y) and r.clean_accuracy == pytest.approx(float((clean == y).double()
                                                                                                 .mean()))
    # cumulative accuracies: non-increasing, the last one is the worst case
    accs = [r.clean_accuracy, *r.attacks.values()]
    assert all(a >= b for a, b in zip(accs, accs[1:]))
    assert list(r.attacks.values())[-1] == pytest.approx(r.robust_accuracy)
    # each attack ran only on the samples every earlier attack left robust
    counts = int(r.clean_correct.sum())
    for name in r.attacks:
        assert r.attacked[name] == counts
        counts -= r.breaks[name]
    assert counts == int(r.robust.sum())
    # the attack that broke each sample, and its adversarial image
    for name in r.attacks:
        assert r.broken_by.count(name) == r.breaks[name]
    assert r.broken_by.count("misclassified") == int((~r.clean_correct).sum())
    assert r.broken_by.count("") == int(r.robust.sum())
    broken = torch.tensor([b in r.attacks for b in r.broken_by])
    assert bool((adv_pred[broken] != y[broken]).all()) and torch.equal(adv_pred[broken], r.adv_pred[broken])
    assert float(r.linf[broken].max()) <= 0.1 + 1e-6 and bool((r.linf[~broken] == 0).all())
    assert torch.equal(r.adv[~broken], x[~broken])
    assert r.breaks["apgd-ce"] > 0 and 0 < r.robust_accuracy < r.clean_accuracy
    rows = r.rows()
    assert len(rows) == n and rows[3]["broken_by"] == r.broken_by[3] and rows[3]["index"] == 3


def test_only_robust_points_are_attacked(trained_digits_model, xy):
    seen = {}
    with contextlib.ExitStack() as stack:
        for reg in ("apgd", "square"):
            orig = attacks.get(reg).fn

            @functools.wraps(orig)  # keeps the signature evaluate checks parameters against
            def spy(model, x, y, *a, _orig=orig, _reg=reg, **k):
                seen[_reg] = (x.clone(), y.clone())
                return _orig(model, x, y, *a, **k)

            stack.enter_context(attacks.registered(dataclasses.replace(attacks.get(reg), fn=spy), replace=True))
        x, y = xy
        r = ev.evaluate(trained_digits_model, (x, y), 0.1, version="custom",
                        attacks=[("apgd-ce", {"steps": 5}), ("square", {"queries": 20})], seed=1)
    xa, _ = seen["apgd"]
    xs, ys = seen["square"]
    assert xa.shape[0] == int(r.clean_correct.sum())
    survivors = r.clean_correct.clone()
    survivors[torch.tensor([b == "apgd-ce" for b in r.broken_by])] = False
    assert torch.equal(xs, x[survivors]) and torch.equal(ys, y[survivors])


def test_ensemble_at_most_each_single_attack(trained_digits_model, xy):
    x, y = xy
    m = trained_digits_model
    ens = ev.evaluate(m, (x, y), 0.08, version="custom", attacks=SMALL, seed=0)
    for k, item in enumerate(SMALL):
        alone = ev.evaluate(m, (x, y), 0.08, version="custom", attacks=[item], seed=k)
        assert ens.robust_accuracy <= alone.robust_accuracy, item[0]
    # the first attack sees the same samples and random stream in both runs: identical break set
    first = ev.evaluate(m, (x, y), 0.08, version="custom", attacks=[SMALL[0]], seed=0)
    assert [b == "apgd-ce" for b in ens.broken_by] == [b == "apgd-ce" for b in first.broken_by]


def test_seeded_and_blocked(trained_digits_model, xy):
    m = trained_digits_model
    kw = {"version": "custom", "attacks": SMALL[:2], "seed": 5}
    a = ev.evaluate(m, xy, 0.1, **kw)
    b = ev.evaluate(m, xy, 0.1, **kw)
    assert a.broken_by == b.broken_by and torch.equal(a.linf, b.linf)
    # streamed in blocks: same bookkeeping shape, every sample in data order
    c = ev.evaluate(m, xy, 0.1, block_size=25, **kw)
    assert torch.equal(c.index, torch.arange(60)) and torch.equal(c.y, xy[1])
    assert c.clean_accuracy == a.clean_accuracy


def test_result_repr_and_dict(trained_digits_model, xy):
    r = ev.evaluate(trained_digits_model, xy, 0.5, norm="l2", version="fast", n_targets=2, seed=0)
    text = repr(r)
    assert "\n" not in text and text.startswith("EvalResult(l2 eps=0.5, fast, n=60") and "apgd-t" in text
    per = ", ".join(f"{k} {100 * v:.2f}%" for k, v in r.attacks.items())
    assert f"[{per}])" in text and len(r.attacks) >= 2  # every attack's accuracy, comma-separated
    d = r.to_dict()
    json.dumps(d)
    assert d["format"] == "robustest-eval-results" and d["version"] == 1 and d["world_size"] == 1
    assert d["threat_model"] == "L2" and d["attacks"] == r.attacks and d["robust_accuracy"] == r.robust_accuracy
    assert sum(d["share_of_breaks"].values()) == pytest.approx(1.0) or sum(r.breaks.values()) == 0
    assert d["settings"]["attacks"][1]["params"]["n_targets"] == 2 and d["settings"]["version"] == "fast"
    assert d["robustbench"]["autoattack_acc"] is None  # only the standard version is AutoAttack
    assert d["robustbench"]["clean_acc"] == f"{100 * r.clean_accuracy:.2f}"
    assert set(d["timings"]) >= {"clean_s", "apgd-ce_s", "apgd-t_s", "total_s"}
    assert "corruptions" not in d


def test_corruptions_and_mce(trained_digits_model, xy):
    m = trained_digits_model
    digits_model = copy.deepcopy(m)  # a weaker baseline: the same network with noisy weights
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in digits_model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    names = ["gaussian_noise", "brightness"]
    r = ev.evaluate(m, xy, 0.1, version="custom", attacks=[("apgd-ce", {"steps": 3})], corruptions=names,
                            severities=(1, 5), baseline=digits_model)
    c = r.corruption
    ref = ev.corruption_accuracy(m, xy, corruptions=names, severities=(1, 5))
    base = ev.corruption_accuracy(digits_model, xy, corruptions=names, severities=(1, 5))
    assert c["mean_corruption_accuracy"] == pytest.approx(ref.mean_corruption_accuracy)
    ce = {n: sum(ref.error[n].values()) / sum(base.error[n].values()) for n in names}
    assert c["mce"] == pytest.approx(sum(ce.values()) / 2)
    rel = {n: sum(e - (1 - ref.clean_accuracy) for e in ref.error[n].values())
           / sum(e - (1 - base.clean_accuracy) for e in base.error[n].values()) for n in names}
    assert c["relative_mce"] == pytest.approx(sum(rel.values()) / 2)
    d = r.to_dict()
    json.dumps(d)
    assert d["corruptions"]["severities"] == [1, 5] and d["robustbench"]["corruptions_acc"]
    assert r.settings["corruptions"]["baseline"] == "model"  # what normalised the mCE, recorded
    # the model as its own baseline: mCE 1
    same = ev.evaluate(m, xy, 0.1, version="custom", attacks=[("apgd-ce", {"steps": 1})],
                               corruptions=names, severities=(1,), baseline=ref)
    assert same.corruption["mce"] == pytest.approx(1.0) and same.settings["corruptions"]["baseline"] == "given errors"
    per = ", ".join(f"{k} {100 * v:.2f}%" for k, v in same.attacks.items())
    flags = "".join(f"; flags {', '.join(f'{f.name} ({f.severity})' for f in same.flags)}" for _ in same.flags[:1])
    assert repr(same) == (f"EvalResult(linf eps=0.1, custom, n=60: clean {100 * same.clean_accuracy:.2f}%, robust "
                          f"{100 * same.robust_accuracy:.2f}% [{per}]; corruptions "
                          f"{100 * same.corruption['mean_corruption_accuracy']:.2f}%{flags})")


def test_published_corruption_sets(trained_digits_model, xy):
    from robustest.evaluate import accuracy

    x, y = xy
    fog = (x.flip(-1), y)
    noisy = ((x + 0.2 * torch.rand(x.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1), y)
    r = ev.evaluate(trained_digits_model, xy, 0.1, version="custom", attacks=[("apgd-ce", {"steps": 1})],
                            corruptions={"fog": {3: fog}, "noise": {1: noisy, 2: fog}})
    acc = r.corruption["accuracy"]
    assert acc["fog"]["3"] == pytest.approx(accuracy(trained_digits_model, fog))
    assert acc["noise"]["1"] == pytest.approx(accuracy(trained_digits_model, noisy))
    assert r.corruption["table"] == "published" and r.settings["corruptions"]["source"] == "published"


def test_measure_reports_autoattack(trained_digits_model, xy):
    rep = ev.measure(trained_digits_model, xy, eps=0.1, whitebox_limit=30, pgd_steps=3, apgd_steps=5,
                             autoattack=True, autoattack_version="fast")
    d = rep.to_dict()
    assert d["autoattack_accuracy"] is not None and d["autoattack_accuracy"] <= d["clean_accuracy"]
    assert d["settings"]["autoattack_version"] == "fast"
    off = ev.measure(trained_digits_model, xy, eps=0.1, whitebox=False)
    assert off.autoattack_accuracy is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_model_cpu_data(trained_digits_model, xy):
    model = trained_digits_model.cuda()
    for name, kw in [("apgd_dlr", {"steps": 3}), ("apgd_t", {"steps": 3, "n_targets": 2}),
                     ("fab_t", {"steps": 3, "n_targets": 2}), ("square", {"queries": 20})]:
        adv = getattr(attacks, name)(model, xy[0][:16], xy[1][:16], eps=0.1, seed=0, **kw)
        assert adv.device == xy[0].device
    r = ev.evaluate(model, xy, 0.1, version="custom", attacks=SMALL, seed=0, keep_adv=True)
    again = ev.evaluate(model, xy, 0.1, version="custom", attacks=SMALL, seed=0)
    assert r.adv.device.type == "cpu" and r.settings["device"].startswith("cuda")
    assert r.broken_by == again.broken_by


def test_corruptions_use_the_evaluation_seed_and_are_timed(trained_digits_model, xy):
    m = trained_digits_model
    kw = {"version": "custom", "attacks": [("apgd-ce", {"steps": 1})], "corruptions": ["gaussian_noise"],
          "severities": (5,)}
    per_seed = {}
    for seed in (0, 5):
        r = ev.evaluate(m, xy, 0.1, seed=seed, **kw)
        ref = ev.corruption_accuracy(m, xy, corruptions=["gaussian_noise"], severities=(5,), seed=seed)
        assert r.corruption["mean_corruption_accuracy"] == ref.mean_corruption_accuracy
        assert r.timings["corruptions_s"] > 0 and "total_s" in r.timings
        per_seed[seed] = ref.accuracy
    assert per_seed[0] != per_seed[5]  # the noise draws differ: the seed reaches the corruptions


def test_a_curve_radius_with_no_survivors_left_is_an_empty_point_of_the_same_shape():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3)).eval()
    x = torch.rand(12, 1, 4, 4)
    y = model(x).argmax(1)  # every sample right: the curve starts from 12 robust candidates
    r = ev.evaluate(model, (x, y), [0.01, 0.9, 1.0], version="custom", attacks=[("apgd-ce", {"steps": 5})])
    first, full, empty = r.curve
    assert full["robust_accuracy"] == 0.0 and full["broke"] == full["attacked"]  # the whole box: all broken
    assert empty == {"eps": 1.0, "robust_accuracy": 0.0, "attacked": 0, "broke": 0, "plan": r.plan,
                     "reliable": True, "flags": [], "seconds": 0.0}
    assert set(empty) == set(first) == set(full)
    assert first["attacked"] == 12 and r.robust_accuracy == 0.0
    # every radius, the smallest included, runs with the options given (not evaluate's defaults)
    assert r.plan == first["plan"] == full["plan"] == "custom" and list(r.attacks) == ["apgd-ce"]


def test_perturbation_quantiles():
    from robustest.evaluate.ensemble import _quantiles

    t = torch.tensor([0.1, 0.3, 0.2, 0.9])
    assert _quantiles(t, torch.tensor([True, True, True, False])) == pytest.approx(
        {"mean": 0.2, "median": 0.2, "max": 0.3})
    assert _quantiles(t, torch.tensor([False, True, False, False])) == pytest.approx(
        {"mean": 0.3, "median": 0.3, "max": 0.3})
    assert _quantiles(t, torch.zeros(4, dtype=torch.bool)) == {}


def test_evaluate_is_silent_unless_progress_is_asked_for(capsys):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3)).eval()
    x = torch.rand(6, 1, 4, 4)
    y = model(x).argmax(1)
    kw = {"version": "custom", "attacks": [("apgd-ce", {"steps": 2})]}
    ev.evaluate(model, (x, y), 0.05, **kw)
    assert capsys.readouterr().err == ""  # a library call draws nothing by default
    ev.evaluate(model, (x, y), 0.05, progress=True, **kw)
    assert capsys.readouterr().err.startswith("evaluate: apgd-ce on 6 samples broke")
