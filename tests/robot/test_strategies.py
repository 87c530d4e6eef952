"""The comparison's baselines (all, adv-train), the new selection strategies (stratified, fol-prop), compute
counted in forward+backward passes, and the paired comparison with random selection (tiny digits settings)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from robustest import robot
from robustest.core.compute import PassCounter
from robustest.core.errors import ConfigError
from robustest.robot import paired_vs_random

TINY = {
    "dataset": "digits", "train_limit": 300, "test_limit": 60, "eps": 0.15, "epochs": 1, "batch_size": 64,
    "whitebox_limit": 30, "whitebox_pgd_steps": 3, "whitebox_restarts": 1, "apgd_steps": 3,
    "convergence_probe": 40, "pool_pgd_steps": 5, "verbose": False,
}


@pytest.fixture(scope="module")
def checkpoint(mlp_digits_checkpoint):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield mlp_digits_checkpoint
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------ PassCounter
def test_pass_counter_counts_forwards_backwards_and_matches_harden():
    from robustest import models
    from robustest.core.modelcall import forward
    from robustest.train import hardening

    torch.manual_seed(0)
    model = models.create("mlp", num_classes=10, in_channels=1, input_size=8)
    x, y = torch.rand(20, 1, 8, 8), torch.arange(20) % 10
    with PassCounter(model) as pc:
        with torch.no_grad():
            forward(model, x)  # 20 forwards, no backward
        assert (pc.forward, pc.backward) == (20, 0) and pc.passes == pytest.approx(20 / 3)
        xa = x[:7].clone().requires_grad_(True)
        loss = F.cross_entropy(forward(model, xa), y[:7])
        torch.autograd.grad(loss, xa)  # an attack step on 7 images
        forward(model, x[:5]).sum().backward()  # a training step on 5
    assert (pc.forward, pc.backward) == (32, 12) and pc.passes == pytest.approx((32 + 24) / 3)
    forward(model, x).sum().backward()  # closed: nothing counted, hook removed
    assert (pc.forward, pc.backward) == (32, 12) and not model._forward_hooks
    # the counter agrees with harden's own analytic count, pgd-at's N (k + 1) passes per epoch, plus the one-image
    # forward harden makes to check the labels against the model's outputs
    with PassCounter(model) as pc:
        res = hardening.harden(model, (x, y), "pgd-at", eps=0.1, epochs=2, steps=3, batch_size=8)
    assert res.compute["passes"] == pytest.approx(2 * 20 * 4)
    assert pc.passes == pytest.approx(res.compute["passes"] + 1 / 3)


# --------------------------------------------------------------------------------------- paired_vs_random
def _cell(strategy, budget, seed, fixed, wb=0.5, clean=0.9):
    return {"strategy": strategy, "budget": budget, "seed": seed,
            "robustness": {"fixed_set_accuracy": fixed, "whitebox_accuracy": wb, "clean_accuracy": clean}}


def test_paired_vs_random_is_a_paired_t_interval():
    rnd = [0.50, 0.40, 0.60, 0.55]
    diffs = [0.05, 0.04, 0.06, 0.03]
    cells = [_cell("random", "5%", s, v) for s, v in enumerate(rnd)]
    cells += [_cell("kmst", "5%", s, v + d) for s, (v, d) in enumerate(zip(rnd, diffs))]
    cells += [_cell("random", "10%", s, 0.7) for s in range(4)]
    cells += [_cell("adv-train", "online", s, 0.3, wb=0.6) for s in range(3)]  # one seed fewer
    cells.append(_cell("gini", "10%", 0, 0.1))  # one seed: no interval
    rows = paired_vs_random(cells)
    k = next(r for r in rows if r["strategy"] == "kmst" and r["metric"] == "fixed_set_accuracy")
    mean, sd = sum(diffs) / 4, float(torch.tensor(diffs, dtype=torch.float64).std())
    half = stats.t.ppf(0.975, 3) * sd / math.sqrt(4)
    assert k["budget"] == "5%" and k["n_seeds"] == 4 and k["mean_diff"] == pytest.approx(mean)
    assert (k["ci_low"], k["ci_high"]) == (pytest.approx(mean - half), pytest.approx(mean + half))
    assert k["ci_low"] > 0  # every seed gains: the interval excludes 0
    same = next(r for r in rows if r["strategy"] == "kmst" and r["metric"] == "clean_accuracy")
    assert same["mean_diff"] == pytest.approx(0.0) and same["ci_low"] == pytest.approx(0.0)
    # a budget-free baseline is compared with random at every budget, on the seeds both ran
    adv = [r for r in rows if r["strategy"] == "adv-train" and r["metric"] == "fixed_set_accuracy"]
    assert [r["budget"] for r in adv] == ["5%", "10%"] and all(r["n_seeds"] == 3 for r in adv)
    assert adv[1]["mean_diff"] == pytest.approx(0.3 - 0.7) and adv[1]["ci_low"] == pytest.approx(-0.4)
    gini = [r for r in rows if r["strategy"] == "gini"]
    assert len(gini) == 3 and gini[0]["n_seeds"] == 1 and gini[0]["ci_low"] is None
    assert {r["metric"] for r in rows} == {"fixed_set_accuracy", "whitebox_accuracy", "clean_accuracy"}
    assert paired_vs_random([c for c in cells if c["strategy"] != "random"]) == []
    with pytest.raises(ConfigError, match="level"):
        paired_vs_random(cells, level=1.5)


def test_paired_vs_random_takes_another_baseline():
    base = [0.50, 0.40, 0.60]
    cells = [_cell("standard", "-", s, v) for s, v in enumerate(base)]
    cells += [_cell("targeted", "-", s, v + d) for s, (v, d) in enumerate(zip(base, [0.02, -0.01, 0.05]))]
    cells += [_cell("random", "-", s, 0.0) for s in range(3)]  # an ordinary strategy now, not the reference
    rows = paired_vs_random(cells, metrics=("fixed_set_accuracy",), baseline="standard")
    assert [r["strategy"] for r in rows] == ["targeted", "random"]
    assert rows[0]["mean_diff"] == pytest.approx(0.02) and rows[0]["ci_low"] < 0 < rows[0]["ci_high"]
    assert rows[1]["mean_diff"] == pytest.approx(-0.5) and rows[1]["n_seeds"] == 3


# --------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("bad, pattern", [
    ({"strategies": ["adv-train"], "finetune_options": {"augment": "crop-flip"}}, "adv-train fine-tunes with"),
    ({"strategies": ["random"], "finetune_options": {"eps_warmup": 0.3}}, "eps_warmup applies to the hardening"),
    ({"strategies": ["adv-train"], "finetune_options": {"eps_warmup": 1.0}}, "eps_warmup"),
    ({"strategy": "adv-train", "finetune_options": {"label_smoothing": 0.1}}, "not 'label_smoothing'"),
    ({"stratified_bins": 0}, "stratified_bins must be an integer >= 1"),
    ({"strategies": ["random", "core-set"]}, "unknown strategy 'core-set'"),
])
def test_config_refuses_bad_values_of_the_new_strategies(bad, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        robot.RobotConfig.from_dict(bad)
    assert "\n" not in str(info.value)
    robot.RobotConfig.from_dict({"strategies": ["adv-train"], "finetune_options": {"optimizer": "sgd"}})
    # harden's recipe is a setting of the hardening strategies too
    robot.RobotConfig.from_dict({"strategies": ["adv-train", "fast-at"],
                                 "finetune_options": {"schedule": "cosine", "eps_warmup": 0.3}})


# ----------------------------------------------------------------------------------- compare end to end
def test_hardening_strategies_train_with_the_recipe_of_finetune_options(checkpoint, tmp_path, monkeypatch):
    """finetune_options' schedule and eps warm-up reach harden; unset, adv-train keeps its constant rate and
    full radius from the first batch."""
    from robustest.train import hardening

    seen = []
    real = hardening.harden

    def spy(*a, **kw):
        seen.append({"eps_warmup": kw.get("eps_warmup"),
                     **{k: getattr(kw["recipe"], k) for k in ("schedule", "optimizer", "momentum")}})
        return real(*a, **kw)

    monkeypatch.setattr(hardening, "harden", spy)
    res = robot.run({**TINY, "model": checkpoint, "strategy": "adv-train", "out": str(tmp_path / "r"),
                     "finetune_options": {"schedule": "cosine", "eps_warmup": 0.5, "optimizer": "sgd",
                                          "momentum": 0.8}})
    assert seen and all(k == {"schedule": "cosine", "eps_warmup": 0.5, "optimizer": "sgd", "momentum": 0.8}
                        for k in seen)
    settings = res["rounds"][0]["train"]["settings"]
    assert settings["schedule"] == "cosine" and settings["eps_warmup"] == 0.5
    robot.run({**TINY, "model": checkpoint, "strategy": "adv-train", "out": str(tmp_path / "plain")})
    assert seen[-1] == {"schedule": None, "eps_warmup": 0.0, "optimizer": "adam", "momentum": None}


def test_a_selection_strategy_beside_adv_train_ignores_hardens_eps_warmup(checkpoint, tmp_path):
    """Regression: with finetune_options' eps_warmup (harden's) a compare of random beside adv-train stopped with an
    internal error (fit() got an unexpected keyword argument 'eps_warmup'): the selection cells fine-tune with the
    config's Recipe, which has no such field."""
    res = robot.compare({**TINY, "model": checkpoint, "budgets": [10], "seeds": [0], "out": str(tmp_path / "c"),
                         "strategies": ["random", "adv-train"], "finetune_options": {"eps_warmup": 0.5}})
    assert [c["strategy"] for c in res["cells"]] == ["random", "adv-train"]


def test_compare_with_baselines_new_strategies_compute_and_paired(checkpoint, tmp_path, results_contract):
    out = tmp_path / "cmp"
    res = robot.compare({**TINY, "model": checkpoint, "budgets": [15], "seeds": [0, 1], "out": str(out),
                         "strategies": ["stratified", "fol-prop", "random", "all", "adv-train"]})
    results_contract(out, "compare")
    cells = res["cells"]
    assert [(c["strategy"], c["budget"]) for c in cells[::2]] == [
        ("stratified", 15), ("fol-prop", 15), ("random", 15), ("all", "100%"), ("adv-train", "online")]
    pool, num_fit, num_val = res["pool"]["size"], res["data"]["num_fit"], res["data"]["num_val"]
    by = {(c["strategy"], c["seed"]): c for c in cells}
    assert by[("all", 0)]["n"] == pool and by[("adv-train", 0)]["n"] == 0 and by[("stratified", 1)]["n"] == 15
    # compute, in passes: the pool's FOL scoring is one pass per test; fine-tuning one per training image and
    # epoch plus a forward per validation image (and one for the label check); adv-train's attack
    # pool_pgd_steps passes per image and epoch
    pc = res["pool"]["compute"]
    assert pc["fol_scoring"] == pytest.approx(pool) and pc["generation"] > 2 * num_fit
    for (s, _), c in by.items():
        k = c["compute"]
        assert k["total"] == pytest.approx(k["pool_generation"] + k["selection_scoring"] + k["finetune"]
                                           + k["adversarial"])
        if s == "adv-train":
            assert k["pool_generation"] == 0 and k["selection_scoring"] == 0
            assert k["adversarial"] == pytest.approx(TINY["epochs"] * num_fit * TINY["pool_pgd_steps"])
            assert k["finetune"] == pytest.approx(TINY["epochs"] * (num_fit + num_val / 3) + 1 / 3)
        else:
            assert k["pool_generation"] == pytest.approx(pc["generation"]) and k["adversarial"] == 0
            assert k["selection_scoring"] == pytest.approx(pool if s in ("stratified", "fol-prop") else 0)
            assert k["finetune"] == pytest.approx(TINY["epochs"] * (num_fit + c["n"] + num_val / 3) + 1 / 3)
    rows = {r["strategy"]: r for r in res["table"]}
    assert rows["all"]["compute_passes_mean"] > rows["random"]["compute_passes_mean"] > 0
    # paired with random: the budgeted ones at 15, the baselines against random's 15
    paired = res["paired_vs_random"]
    assert {(p["strategy"], p["budget"]) for p in paired} == {(s, 15) for s in ("stratified", "fol-prop", "all",
                                                                                  "adv-train")}
    assert all(p["n_seeds"] == 2 for p in paired) and len(paired) == 12
    p = next(p for p in paired if p["strategy"] == "all" and p["metric"] == "clean_accuracy")
    diff = [by[("all", s)]["robustness"]["clean_accuracy"] - by[("random", s)]["robustness"]["clean_accuracy"]
            for s in (0, 1)]
    assert p["mean_diff"] == pytest.approx(sum(diff) / 2)
    # the report shows the paired table and the compute column
    html = (out / "report.html").read_text()
    assert "against random selection (paired over seeds)" in html and "compute (passes)" in html
    # fol-prop leans to high FOL
    pool_fol = torch.load(out / "state" / "pool.pt", weights_only=True)["fol"]
    sel = torch.load(out / "state" / "cells" / "fol-prop_b15_s0" / "selected.pt", weights_only=True)["pool_index"]
    assert float(pool_fol[sel].mean()) > float(pool_fol.mean())


def test_kcenter_in_compare_and_loop_selects_by_penultimate_features(checkpoint, tmp_path):
    from robustest.metrics.activations import penultimate_features
    from robustest.models.checkpoints import load_model

    out = tmp_path / "kc"
    res = robot.compare({**TINY, "model": checkpoint, "budgets": [12], "seeds": [0, 1], "out": str(out),
                         "strategies": ["kcenter", "random"]})
    pool = torch.load(out / "state" / "pool.pt", weights_only=True)
    model0 = load_model(checkpoint)
    feats = penultimate_features(model0, pool["x"]).double()
    assert feats.dim() == 2 and feats.shape[0] == len(pool["x"]) and feats.shape[1] < 10 * 64
    firsts = set()
    for sd in (0, 1):
        idx = torch.load(out / "state" / "cells" / f"kcenter_b12_s{sd}" / "selected.pt",
                         weights_only=True)["pool_index"].tolist()
        assert len(idx) == 12 == len(set(idx))
        # every pick after the first is the pool test farthest from its nearest chosen centre
        for i in range(1, len(idx)):
            d = torch.cdist(feats, feats[idx[:i]]).min(dim=1).values
            d[idx[:i]] = -1
            assert idx[i] == int(torch.argmax(d))
        firsts.add(idx[0])
    assert len(firsts) == 2  # seeded per cell
    # compare does not use the loop's strategy: another value (or the former default) resumes the same comparison
    again = robot.compare({**TINY, "model": checkpoint, "budgets": [12], "seeds": [0, 1], "out": str(out),
                           "strategies": ["kcenter", "random"], "strategy": "best", "resume": True})
    assert again["cells"] == res["cells"]
    k = next(c for c in res["cells"] if c["strategy"] == "kcenter")["compute"]
    assert k["selection_scoring"] == pytest.approx(len(pool["x"]) / 3)  # one forward per pool test
    loop = robot.run({**TINY, "model": checkpoint, "strategy": "kcenter", "budget": 10, "rounds": 1,
                      "convergence_tol": 0.0, "out": str(tmp_path / "kcloop")})
    assert loop["rounds"][0]["selected"]["n"] == 10 and loop["rounds"][0]["compute"]["selection_scoring"] > 0


def test_loop_runs_adv_train_and_all(checkpoint, tmp_path, results_contract):
    res = robot.run({**TINY, "model": checkpoint, "strategy": "adv-train", "rounds": 1, "convergence_tol": 0.0,
                     "out": str(tmp_path / "adv")})
    results_contract(tmp_path / "adv", "run")
    rec = res["rounds"][0]
    assert rec["pool"]["size"] == 0 and rec["selected"]["n"] == 0 and rec["train"]["method"] == "pgd-at"
    assert rec["compute"]["adversarial"] == pytest.approx(TINY["epochs"] * res["data"]["num_fit"] * 5)
    res = robot.run({**TINY, "model": checkpoint, "strategy": "all", "rounds": 1, "convergence_tol": 0.0,
                     "out": str(tmp_path / "all")})
    rec = res["rounds"][0]
    assert rec["selected"]["n"] == rec["pool"]["size"] > 0 and rec["compute"]["selection_scoring"] == 0
    assert rec["compute"]["pool_generation"] > 0 and rec["compute"]["adversarial"] == 0


def test_cell_compute_sums_its_parts_and_marks_uncounted_ones():
    from robustest.robot.compute import cell_compute

    rec = cell_compute(pool_generation=100, selection_scoring=10.5, finetune=30, adversarial=0)
    assert rec == {"pool_generation": 100.0, "selection_scoring": 10.5, "finetune": 30.0, "adversarial": 0.0,
                   "total": 140.5}
    assert cell_compute(pool_generation=None, finetune=3)["total"] is None
