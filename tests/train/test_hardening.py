"""Adversarial fine-tuning (robustest.train.harden): robustness gains, compute accounting, determinism, resume,
argument validation."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from robustest import evaluate as ev
from robustest import metrics
from robustest.core.errors import ConfigError
from robustest.core.seeding import derive_seed
from robustest.train import early_stopping, fit, fitting, harden, harden_settings, hardening, objectives, schedules
from robustest.train.objectives import inner
from robustest.train.recipes import Recipe

EPS = 0.15


@pytest.fixture(scope="module")
def digits_split():
    """(train, test) tensors: the first 600 digits training images and the first 150 test images."""
    from robustest import data

    tr, te = data.load("digits", split="train"), data.load("digits", split="test")
    return (tr.tensors[0][:600], tr.tensors[1][:600]), (te.tensors[0][:150], te.tensors[1][:150])


@pytest.fixture(scope="module")
def base_model(digits_split):
    """digits_cnn trained 15 epochs on the 600 images (clean accuracy about 0.97, white-box at eps 0.15 about 0.14)."""
    from robustest import models

    x, y = digits_split[0]
    torch.manual_seed(0)
    m = models.create("digits_cnn", input_size=8, mean=float(x.mean()), std=float(x.std()))
    fit(m, (x, y), epochs=15, batch_size=32, seed=0, progress=False)
    return m.eval()


def _whitebox(model, data) -> float:
    return ev.whitebox_accuracy(model, data, EPS, pgd_steps=10, pgd_restarts=1, apgd_steps=20)["worst"]


def _states_equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ------------------------------------------------------------------------------------------- robustness
# gaussian-noise trains for randomised smoothing (L2 certificates of the smoothed classifier), not against L-inf
# attacks on the base model: it lifts white-box accuracy here by about 0.13 only. ibp and crown-ibp train the
# bounds of certified training, which take longer than 3 epochs to tighten on digits_cnn (white-box accuracy falls
# during their ramp): tests/train/test_objectives_certified.py measures them by certified accuracy
@pytest.mark.parametrize("method", [m for m in objectives.names() if m not in ("gaussian-noise", "ibp", "crown-ibp")])
def test_every_method_raises_whitebox_accuracy(method, base_model, digits_split):
    (x, y), test = digits_split
    before = _whitebox(base_model, test)
    model = copy.deepcopy(base_model)
    # 3 epochs on 400 images lift every method by 0.2-0.43 (seeds 0 and 1; TRADES gains least)
    steps = None if objectives.get(method).fixed_steps else 5  # the single-step methods take no steps
    res = harden(model, (x[:400], y[:400]), method, eps=EPS, epochs=3, steps=steps, batch_size=32,
                 recipe=Recipe(lr=2e-3), seed=0)
    after = _whitebox(model, test)
    assert before < 0.2
    assert after >= before + 0.15, (method, before, after)
    assert ev.accuracy(model, test) > 0.75
    assert len(res.epochs) == 3 and not model.training


# ------------------------------------------------------------------------------------------ compute counts
def test_pgd_at_compute_equals_the_analytic_count(base_model, digits_split):
    x, y = digits_split[0][0][:100], digits_split[0][1][:100]
    n, k, e = 100, 4, 2
    res = harden(copy.deepcopy(base_model), (x, y), "pgd-at", eps=EPS, epochs=e, steps=k, batch_size=32)
    c = res.compute
    assert c["attack_forward"] == c["attack_backward"] == e * n * k
    assert c["train_forward"] == c["train_backward"] == e * n
    assert c["passes"] == pytest.approx(e * n * (k + 1))
    assert all(r["compute"]["passes"] == pytest.approx(n * (k + 1)) for r in res.epochs)
    assert all(r["attack_evals_mean"] == k for r in res.epochs)

    mixed = harden(copy.deepcopy(base_model), (x, y), "pgd-at", eps=EPS, epochs=1, steps=k, mix=0.5).compute
    assert mixed["passes"] == pytest.approx(n * (k + 2))
    clean = harden(copy.deepcopy(base_model), (x, y), "pgd-at", eps=EPS, epochs=1, steps=k, mix=1.0).compute
    assert clean["passes"] == pytest.approx(n) and clean["attack_forward"] == 0
    trades = harden(copy.deepcopy(base_model), (x, y), "trades", eps=EPS, epochs=1, steps=k).compute
    assert trades["attack_forward"] == n * (k + 1) and trades["attack_backward"] == n * k
    assert trades["passes"] == pytest.approx(n * (k + 2 + 1 / 3))
    fast = harden(copy.deepcopy(base_model), (x, y), "fast-at", eps=EPS, epochs=1).compute
    assert fast["passes"] == pytest.approx(2 * n)


@pytest.mark.parametrize("recipe", [{"eps_warmup": 0.0}, {}, {"recipe": Recipe(schedule="cosine")},
                                    {"eps_train": 0.25}])
def test_pgd_at_is_the_textbook_loop_given_the_same_random_numbers(base_model, digits_split, recipe):
    """A plain-PyTorch PGD-AT loop fed the random numbers harden draws (per-epoch shuffling and random starts)
    ends with bit-identical weights: the recipe has nothing else in it. With the default eps warm-up the plain
    loop ramps eps linearly over the first 30 % of the batches (alpha with it); with the cosine schedule it decays
    the rate by a cosine; with ``eps_train`` it attacks at that radius (alpha given at it) instead of eps."""
    import math

    import torch.nn.functional as F

    from robustest.core.seeding import make_generator

    x, y = digits_split[0][0][:160], digits_split[0][1][:160]
    eps, steps, alpha, bs = EPS, 3, 0.06, 64
    ours = copy.deepcopy(base_model)
    harden(ours, (x, y), "pgd-at", eps=eps, epochs=2, steps=steps, alpha=alpha, batch_size=bs, seed=4, **recipe)
    plain = copy.deepcopy(base_model)
    opt = torch.optim.Adam(plain.parameters(), lr=1e-3)
    total, t = 2 * 3, 0  # 2 epochs of 3 batches
    radius = recipe.get("eps_train", eps)
    for epoch in (1, 2):
        torch.manual_seed(derive_seed(4, epoch, "global"))  # dropout
        perm = torch.randperm(160, generator=make_generator(derive_seed(4, epoch, "shuffle")))
        gen = make_generator(derive_seed(4, epoch, "attack"))
        for s in range(0, 160, bs):
            e = radius if "eps_warmup" in recipe else radius * min(1.0, (t + 1) / (0.3 * total))
            a = alpha * e / radius
            xb, yb = x[perm[s:s + bs]], y[perm[s:s + bs]]
            plain.eval()
            xa = (xb + torch.rand(xb.shape, generator=gen).mul_(2 * e).sub_(e)).clamp(0, 1)
            for _ in range(steps):
                xa.requires_grad_(True)
                (g,) = torch.autograd.grad(F.cross_entropy(plain(xa), yb, reduction="sum"), xa)
                xa = torch.min(torch.max(xa.detach() + a * g.sign(), (xb - e).clamp(min=0)),
                               (xb + e).clamp(max=1))
            plain.train()
            loss = F.cross_entropy(plain(xa), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            t += 1
            if "recipe" in recipe:
                for group in opt.param_groups:
                    group["lr"] = 1e-3 * 0.5 * (1 + math.cos(math.pi * t / total))
    plain.eval()
    assert _states_equal(ours, plain)


def test_harden_settings_checks_the_eps_warmup_fraction_and_refuses_another_loops_objective():
    assert harden_settings("pgd-at", eps=0.3, eps_warmup=0.0)["eps_warmup"] == 0.0
    assert harden_settings("pgd-at", eps=0.3, eps_warmup=0.999)["eps_warmup"] == 0.999
    assert harden_settings()["method"] == "pgd-at" and harden_settings()["keep"] == "last"
    for bad in (1.0, -0.1, 2.0):  # a fraction of the steps in [0, 1): 1 would never reach eps
        with pytest.raises(ConfigError, match=rf"^eps_warmup must be a number in \[0, 1\), got {bad}$"):
            harden_settings("pgd-at", eps=0.3, eps_warmup=bad)
    with pytest.raises(ConfigError, match=r"^unknown harden method 'cross-entropy' \(cross-entropy is the training "
                                          r"objective of another loop\)"):
        harden_settings("cross-entropy", eps=0.3)
    assert harden_settings("fast-at", eps=0.3, co_guard=True)["co_guard"] is True
    assert harden_settings("fast-at", eps=0.3, co_guard=False)["co_guard"] is False
    for seed in (True, "1", 1.0):
        with pytest.raises(ConfigError, match=f"^seed must be an integer, got {seed!r}$"):
            harden_settings("pgd-at", eps=0.3, seed=seed)


def test_eps_train_is_the_training_radius_and_validation_stays_at_eps(base_model, digits_split, monkeypatch):
    """The attack of training works at eps_train (its default step scaled to it) while validation, the guard and
    the kept epoch measure at eps; the epoch records the training radius."""
    s = harden_settings("pgd-at", eps=0.3, eps_train=0.4)
    assert (s["eps"], s["eps_train"], s["alpha"]) == (0.3, 0.4, pytest.approx(0.1))  # 2.5 * 0.4 / 10
    assert harden_settings("fast-at", eps=0.3, eps_train=0.4)["alpha"] == pytest.approx(0.5)
    assert harden_settings("pgd-at", eps=0.3, eps_train=0.4, alpha=0.05)["alpha"] == 0.05
    assert harden_settings("pgd-at", eps=0.3)["eps_train"] == 0.3
    with pytest.raises(ConfigError, match=r"^eps_train must lie in \(0, 1\]"):
        harden_settings("pgd-at", eps=0.3, eps_train=1.5)
    (x, y), test = digits_split
    seen = []
    monkeypatch.setattr(early_stopping, "validate", lambda model, xv, yv, eps, *a, **k: seen.append(eps) or {
        "val_clean_accuracy": 0.9, "val_apgd_accuracy": 0.5})  # fast-at validates with APGD-CE
    res = harden(copy.deepcopy(base_model), (x[:64], y[:64]), "fast-at", eps=EPS, eps_train=2 * EPS, epochs=2,
                 val=test, eps_warmup=0.0, batch_size=32)
    assert seen == [EPS, EPS] and [r["eps"] for r in res.epochs] == [2 * EPS, 2 * EPS]
    assert res.settings["eps_train"] == 2 * EPS and res.settings["alpha"] == pytest.approx(2.5 * EPS)


def test_fol_budget_spends_fewer_passes_than_pgd_at(base_model, digits_split):
    x, y = digits_split[0]
    pgd = harden(copy.deepcopy(base_model), (x, y), "pgd-at", eps=EPS, epochs=1, steps=10)
    fol = harden(copy.deepcopy(base_model), (x, y), "fol-budget", eps=EPS, epochs=1, steps=10)
    assert fol.compute["passes"] < 0.8 * pgd.compute["passes"]
    rec = fol.epochs[0]
    assert 1 <= rec["attack_evals_mean"] < 10 and rec["stopped_early"] > 0.3
    # the count is the active set's size summed over the steps: attack forwards = backwards = evaluations
    assert fol.compute["attack_forward"] == fol.compute["attack_backward"] == round(rec["attack_evals_mean"] * 600)


def test_early_stopping_pgd_is_pgd_when_nothing_stops(base_model, digits_split):
    x, y = digits_split[1]
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    adv, evals = inner.pgd(base_model, x, y, g1, eps=EPS, alpha=0.05, steps=5, threshold=-1.0,
                                first_check=0, stop_misclassified=False)
    ref, ref_evals = inner.pgd(base_model, x, y, g2, eps=EPS, alpha=0.05, steps=5)
    assert torch.equal(adv, ref) and torch.equal(evals, ref_evals) and bool((evals == 5).all())


def test_early_stopping_pgd_stays_in_the_ball_and_stops_misclassified(base_model, digits_split):
    x, y = digits_split[1]
    adv, evals = inner.pgd(base_model, x, y, torch.Generator().manual_seed(0), eps=EPS, alpha=0.05, steps=10,
                                threshold=0.0, first_check=1, stop_misclassified=True)
    assert float((adv - x).abs().max()) <= EPS + 1e-6 and float(adv.min()) >= 0 and float(adv.max()) <= 1
    stopped = evals < 10
    assert bool(stopped.any()) and bool((evals >= 1).all())
    with torch.no_grad():
        wrong = base_model(adv).argmax(1) != y
    assert bool(wrong[stopped].all())  # stopped by the misclassification rule (threshold 0 is never met here)


def test_fol_of_the_inner_loop_is_robot_fol(base_model, digits_split):
    x, y = digits_split[1]
    x_adv = (x + 0.1 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).sign()).clamp(0, 1)
    from robustest.attacks import input_gradient

    g, _ = input_gradient(base_model, x_adv, y)
    ours = inner.fol(g, x_adv - x, EPS)
    ref = metrics.fol(base_model, x_adv, y, x0=x, eps=EPS)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


def test_fosc_schedule_falls_linearly_to_zero():
    vals = [schedules.fosc_schedule(e, 10, 0.5, 0.8) for e in range(1, 11)]
    assert vals[0] == 0.5 and vals[-1] == 0.0 and vals[8] == 0.0
    assert vals[1] == pytest.approx(0.5 * (1 - 1 / 8))
    assert all(a >= b for a, b in zip(vals, vals[1:]))


def test_adversarial_examples_do_not_touch_batchnorm_statistics(digits_split):
    x, y = digits_split[0][0][:128], digits_split[0][1][:128]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 64, 10))
    calls = []
    model[1].register_forward_hook(lambda m, i, o: calls.append(m.training))
    harden(model, (x, y), "pgd-at", eps=EPS, epochs=1, steps=3, batch_size=64)
    # the label check (one eval forward), then per batch 3 attack steps in eval mode and 1 update in train mode
    assert calls == [False] + ([False] * 3 + [True]) * 2


# --------------------------------------------------------------------------------- determinism and resume
def test_same_seed_same_model_other_seed_other_model(base_model, digits_split):
    x, y = digits_split[0][0][:200], digits_split[0][1][:200]
    runs = []
    for seed in (0, 0, 1):
        m = copy.deepcopy(base_model)
        harden(m, (x, y), "fol-budget", eps=EPS, epochs=2, steps=4, seed=seed)
        runs.append(m)
    assert _states_equal(runs[0], runs[1])
    assert not _states_equal(runs[0], runs[2])


@pytest.mark.parametrize("method", ["pgd-at", "fosc"])
def test_resume_after_an_interruption_gives_the_same_model(method, base_model, digits_split, tmp_path):
    x, y = digits_split[0][0][:200], digits_split[0][1][:200]
    kw = {"eps": EPS, "epochs": 3, "steps": 3, "batch_size": 64, "seed": 5}
    full = copy.deepcopy(base_model)
    ref = harden(full, (x, y), method, **kw, state_dir=tmp_path / "full")

    class Stop(Exception):
        pass

    def interrupt(epoch, model, record):
        if epoch == 2:
            raise Stop

    part = copy.deepcopy(base_model)
    with pytest.raises(Stop):
        harden(part, (x, y), method, **kw, state_dir=tmp_path / "part", on_epoch_end=interrupt)
    with pytest.raises(ConfigError, match="resume"):  # the state is never silently overwritten
        harden(copy.deepcopy(base_model), (x, y), method, **kw, state_dir=tmp_path / "part")
    with pytest.raises(ConfigError, match="other settings"):
        harden(copy.deepcopy(base_model), (x, y), method, **{**kw, "seed": 6}, state_dir=tmp_path / "part",
               resume=True)
    resumed = copy.deepcopy(base_model)  # a fresh copy of the original: the state brings the trained weights
    res = harden(resumed, (x, y), method, **kw, state_dir=tmp_path / "part", resume=True)
    assert res.resumed_epochs == 2 and len(res.epochs) == 3
    assert _states_equal(full, resumed)
    strip = [{k: v for k, v in e.items() if k != "seconds"} for e in ref.epochs]
    assert strip == [{k: v for k, v in e.items() if k != "seconds"} for e in res.epochs]
    assert res.compute == ref.compute


def test_resume_keeps_the_best_epoch_and_the_schedule(base_model, digits_split, tmp_path):
    """With validation data and keep='best', a resumed run ends with the same kept epoch and weights."""
    (x, y), test = digits_split
    x, y = x[:200], y[:200]
    kw = {"eps": EPS, "epochs": 3, "steps": 2, "batch_size": 64, "seed": 5, "val": test, "val_steps": 2}
    full = copy.deepcopy(base_model)
    ref = harden(full, (x, y), "pgd-at", **kw, state_dir=tmp_path / "full")

    class Stop(Exception):
        pass

    def interrupt(epoch, model, record):
        if epoch == 2:
            raise Stop

    with pytest.raises(Stop):
        harden(copy.deepcopy(base_model), (x, y), "pgd-at", **kw, state_dir=tmp_path / "part", on_epoch_end=interrupt)
    resumed = copy.deepcopy(base_model)
    res = harden(resumed, (x, y), "pgd-at", **kw, state_dir=tmp_path / "part", resume=True)
    assert res.settings["keep"] == "best" and res.kept_epoch == ref.kept_epoch == ref.best_epoch
    assert _states_equal(full, resumed)
    assert [e["lr"] for e in res.epochs] == [e["lr"] for e in ref.epochs]


def test_eps_schedule_ramps_linearly_then_holds():
    d = hardening.harden_settings()
    assert (d["schedule"], d["eps_warmup"], d["optimizer"], d["lr"], d["keep"]) == (None, 0.3, "adam", 1e-3, "last")
    assert (d["method"], d["eps"], d["norm"], d["epochs"], d["batch_size"], d["seed"]) == ("pgd-at", 0.3, "linf", 5,
                                                                                            128, 0)
    assert [schedules.eps_schedule(s, 10, 0.3, 0.3) for s in range(5)] == pytest.approx([0.1, 0.2, 0.3, 0.3, 0.3])
    assert schedules.eps_schedule(0, 10, 0.3, 0.0) == 0.3
    assert schedules.eps_schedule(0, 2, 0.3, 0.3) == 0.3  # a warm-up shorter than one step is none


def _scripted_validation(monkeypatch, scores):
    """Make harden's validation return ``scores`` (the robust accuracy of the attack asked for, one per epoch), and
    the guard's short-long check no gap (tests/train/test_overstated_guard.py tests that rule)."""
    it = iter(scores)
    monkeypatch.setattr(early_stopping, "validate", lambda *a, **k: {
        "val_clean_accuracy": 0.9, early_stopping.VAL_ATTACKS[a[6] if len(a) > 6 else "pgd"]: next(it)})
    monkeypatch.setattr(early_stopping, "short_long", lambda *a: {"val_short_accuracy": 0.5, "val_long_accuracy": 0.5})


def _snapshots():
    """(weights, on_epoch_end): a dict filled with a copy of the model after every epoch."""
    weights = {}

    def snap(epoch, model, record):
        weights[epoch] = copy.deepcopy(model)

    return weights, snap


def test_keep_best_ends_with_the_best_validation_epoch(base_model, digits_split, monkeypatch):
    (x, y), test = digits_split
    x, y = x[:128], y[:128]
    weights, snap = _snapshots()
    for keep, kept in (("best", 2), ("last", 3)):
        _scripted_validation(monkeypatch, [0.3, 0.5, 0.4])
        m = copy.deepcopy(base_model)
        res = harden(m, (x, y), "pgd-at", eps=EPS, epochs=3, steps=2, val=test, keep=keep, on_epoch_end=snap)
        assert res.best_epoch == 2 and res.kept_epoch == kept and res.guard_epoch is None
        assert _states_equal(m, weights[kept]) and not _states_equal(m, weights[5 - kept])
    with pytest.raises(ConfigError, match="keep='best' picks the epoch by validation"):
        harden(copy.deepcopy(base_model), (x, y), "pgd-at", eps=EPS, epochs=1, keep="best")
    with pytest.raises(ConfigError, match="keep must be"):
        harden(copy.deepcopy(base_model), (x, y), "pgd-at", eps=EPS, epochs=1, keep="first")


def test_fast_at_guard_stops_at_the_collapse_and_restores_the_best(base_model, digits_split, monkeypatch):
    (x, y), test = digits_split
    x, y = x[:128], y[:128]
    weights, snap = _snapshots()
    _scripted_validation(monkeypatch, [0.40, 0.45, 0.20, 0.5, 0.5])  # 0.20 < 0.45 / 2 and 25 points down
    m = copy.deepcopy(base_model)
    res = harden(m, (x, y), "fast-at", eps=EPS, epochs=5, val=test, keep="last", on_epoch_end=snap)
    assert res.settings["co_guard"] is True
    assert res.guard_epoch == 3 and len(res.epochs) == 3 and res.epochs[-1]["guard"] == "collapsed"
    assert res.kept_epoch == res.best_epoch == 2 and _states_equal(m, weights[2])
    _scripted_validation(monkeypatch, [0.40, 0.45, 0.20, 0.5, 0.5])
    off = harden(copy.deepcopy(base_model), (x, y), "fast-at", eps=EPS, epochs=5, val=test, keep="last",
                 co_guard=False)
    assert off.guard_epoch is None and len(off.epochs) == 5 and off.kept_epoch == 5
    with pytest.raises(ConfigError, match="co_guard applies to method fast-at / n-fgsm / grad-align only"):
        harden(copy.deepcopy(base_model), (x, y), "pgd-at", eps=EPS, epochs=1, co_guard=True)


def test_the_guard_waits_for_the_full_radius(base_model, digits_split, monkeypatch):
    """Regression: a drop in the eps warm-up (validation at a larger radius than training's) no longer stops a run:
    with the warm-up over half of 10 epochs, epoch 6 is the first trained at the full radius."""
    (x, y), test = digits_split
    x, y = x[:128], y[:128]
    for scores, stop, kept in (([0.2, 0.08, 0.3, 0.4, 0.45, 0.5, 0.2, 0.5, 0.5, 0.5], 7, 6),  # 0.08: noise, trains on
                               ([0.3, 0.45, 0.1, 0.1, 0.1, 0.1, 0.5, 0.5, 0.5, 0.5], 6, 2)):  # a collapse that stays
        _scripted_validation(monkeypatch, scores)
        res = harden(copy.deepcopy(base_model), (x, y), "fast-at", eps=EPS, epochs=10, batch_size=64, val=test,
                     eps_warmup=0.5)
        assert res.guard_epoch == stop and res.epochs[-1]["guard"] == "collapsed" and res.kept_epoch == kept


def _perfect_fast_at():
    """fast-at under another name whose training logits are always right: training adversarial accuracy 1.0."""
    import dataclasses

    fast = objectives.get("fast-at")

    def step(model, x, y, gen, ctx):
        out = fast.step(model, x, y, gen, ctx)
        return dataclasses.replace(out, logits=torch.nn.functional.one_hot(y, 10).float())

    return dataclasses.replace(fast, name="perfect-fast-at", step=step)


@pytest.mark.parametrize("scores, warmup, guard_epoch", [
    ([0.3, 0.9, 0.9], 0.0, 1),    # 1.0 - 0.3 >= 0.5 in the first epoch: a collapse that never rose
    ([0.5, 0.9, 0.9], 0.0, 1),    # exactly CO_GAP apart counts
    ([0.51, 0.51, 0.51], 0.0, None),
    ([0.3, 0.3, 0.9], 0.3, 2),    # epoch 1 trains inside the eps warm-up: its adversarial accuracy is not comparable
])
def test_guard_stops_a_collapse_that_never_rose(scores, warmup, guard_epoch, base_model, digits_split, monkeypatch):
    (x, y), test = digits_split
    _scripted_validation(monkeypatch, list(scores))
    with objectives.registered(_perfect_fast_at()):
        res = harden(copy.deepcopy(base_model), (x[:128], y[:128]), "perfect-fast-at", eps=EPS, epochs=3, val=test,
                     eps_warmup=warmup, batch_size=32)
    assert [r["adv_accuracy"] for r in res.epochs] == [1.0] * len(res.epochs)
    assert res.guard_epoch == guard_epoch
    if guard_epoch is None:
        assert len(res.epochs) == 3 and all("guard" not in r for r in res.epochs)
    else:
        assert len(res.epochs) == guard_epoch and res.epochs[-1]["guard"] == "masked"
        assert res.best_epoch == (None if guard_epoch == 1 else 1)
        assert res.kept_epoch == (1 if guard_epoch == 1 else res.best_epoch)


@pytest.mark.parametrize("adv, pgd, masked", [(0.9, 0.4, True), (0.9, 0.41, False), (0.95, 0.05, True),
                                              (0.5, 0.0, True), (0.49, 0.0, False), (0.2, 0.8, False)])
def test_masked_rule(adv, pgd, masked):
    assert early_stopping.CO_GAP == 0.5
    assert early_stopping.masked(adv, pgd) is masked


@pytest.mark.parametrize("score, best, collapsed", [(0.2, 0.45, True), (0.3, 0.45, False), (0.04, 0.1, False),
                                                    (0.0, 0.1, True), (0.5, 0.5, False), (0.225, 0.45, False),
                                                    (0.3, 0.5, False), (0.2, 0.5, True)])
def test_collapse_rule(score, best, collapsed):
    assert early_stopping.CO_RATIO == 0.5 and early_stopping.CO_MIN_DROP == 0.1
    assert early_stopping.collapsed(score, best) is collapsed  # (0.225, 0.45): exactly half is not below half


def test_collapse_rule_drop_of_exactly_the_minimum_counts(monkeypatch):
    monkeypatch.setattr(early_stopping, "CO_MIN_DROP", 0.25)
    assert early_stopping.collapsed(0.125, 0.375) is True  # under half, and 0.25 down: exactly the minimum
    assert early_stopping.collapsed(0.125, 0.37) is False


def test_keep_best_takes_the_latest_of_equal_validation_scores(base_model, digits_split, monkeypatch):
    (x, y), test = digits_split
    _scripted_validation(monkeypatch, [0.5, 0.5, 0.4])
    res = harden(copy.deepcopy(base_model), (x[:64], y[:64]), "pgd-at", eps=EPS, epochs=3, steps=1, val=test)
    assert res.best_epoch == 2 and res.kept_epoch == 2


def test_validation_is_pgd_of_quarter_eps_steps_from_a_random_start(base_model, digits_split, monkeypatch):
    import robustest.attacks

    (_, _), (xv, yv) = digits_split
    calls = []
    real = robustest.attacks.attack

    def spy(*args, **kw):
        calls.append((args[0], kw))
        return real(*args, **kw)

    monkeypatch.setattr(robustest.attacks, "attack", spy)
    got = early_stopping.validate(base_model, xv, yv, 0.2, 3, seed=5)
    assert calls == [("pgd", {"eps": 0.2, "alpha": 0.05, "steps": 3, "random_start": True, "seed": 5})]
    want = real("pgd", base_model, (xv, yv), eps=0.2, alpha=0.05, steps=3, random_start=True, seed=5)
    assert got == {"val_clean_accuracy": want.clean_accuracy, "val_pgd_accuracy": want.robust_accuracy}


def test_validation_data_is_measured_every_epoch(base_model, digits_split):
    from robustest.core.seeding import derive_seed

    (x, y), test = digits_split
    weights, snap = _snapshots()
    res = harden(copy.deepcopy(base_model), (x[:100], y[:100]), "fast-at", eps=EPS, epochs=2, val=test, val_steps=3,
                 on_epoch_end=snap)
    for r in res.epochs:  # each epoch's figures are those of that epoch's weights, with the run's validation seed
        want = early_stopping.validate(weights[r["epoch"]], *test, EPS, 3, derive_seed(res.settings["seed"], "val"),
                                       "apgd-ce")  # fast-at's default validation attack
        assert r["val_apgd_accuracy"] == want["val_apgd_accuracy"] and "val_pgd_accuracy" not in r
        assert r["val_clean_accuracy"] == want["val_clean_accuracy"]


# ----------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw, match", [
    ({"eps": 0.0}, r"^eps must lie in \(0, 1\] for the L-inf threat model"), ({"eps": 1.5}, "eps"),
    ({"eps": float("nan")}, "eps"), ({"method": "madry"}, "unknown"),
    ({"epochs": 0}, r"^epochs must be an integer >= 1, got 0$"),
    ({"method": "fol-budget", "fol_threshold": float("inf")}, "fol_threshold"),
    ({"method": "fol-budget", "fol_threshold": float("nan")}, "fol_threshold"),
    ({"method": "fosc", "fosc_c_max": float("inf")}, "fosc_c_max"), ({"method": "fosc", "fosc_warmup": 0}, "warmup"),
    ({"mix": 1.5}, "mix"), ({"method": "trades", "mix": 0.5}, "pgd-at only"), ({"beta": 3.0}, "trades only"),
    ({"method": "fast-at", "steps": 5}, "one step"), ({"steps": 0}, "steps"), ({"recipe": Recipe(lr=-1.0)}, "lr"),
    ({"recipe": Recipe(optimizer="lbfgs")}, "optimizer"),
    ({"method": "fol-budget", "fol_min_steps": 10}, "fol_min_steps"),
    ({"recipe": Recipe(label_smoothing=0.1)}, "harden does not take the recipe option label_smoothing"),
    ({"recipe": Recipe(augment="crop-flip")}, "harden does not take the recipe option augment"),
    ({"recipe": {"lr": 0.1}}, "recipe must be a robustest.train.recipes.Recipe"),
    ({"epochs": 2, "recipe": Recipe(warmup_epochs=2)}, r"warmup_epochs must be below the number of epochs \(2\)"),
])
def test_bad_arguments_fail_before_any_work(kw, match, base_model, digits_split, monkeypatch):
    monkeypatch.setattr(hardening, "_batch", lambda *a, **k: pytest.fail("work started"))
    args = {"method": "pgd-at", "eps": EPS, "epochs": 1, **kw}
    with pytest.raises(ConfigError, match=match) as info:
        harden(copy.deepcopy(base_model), digits_split[0], **args)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=match):
        harden_settings(**args)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.freeze is deprecated in 2.13
def test_models_without_trainable_parameters_are_refused(base_model, digits_split, monkeypatch):
    monkeypatch.setattr(hardening, "_batch", lambda *a, **k: pytest.fail("work started"))
    frozen = copy.deepcopy(base_model)
    for p in frozen.parameters():
        p.requires_grad_(False)
    with pytest.raises(ConfigError, match="no trainable parameters"):
        harden(frozen, digits_split[0], eps=EPS, epochs=1)
    scripted = torch.jit.freeze(torch.jit.script(copy.deepcopy(base_model).eval()))
    with pytest.raises(ConfigError, match="no trainable parameters"):
        harden(scripted, digits_split[0], eps=EPS, epochs=1)


def test_settings_resolve_the_method_defaults():
    s = harden_settings("pgd-at", eps=0.3)
    assert s["steps"] == 10 and s["alpha"] == pytest.approx(0.075) and s["mix"] == 0.0
    assert harden_settings("fast-at", eps=0.2)["alpha"] == pytest.approx(0.25)
    assert harden_settings("trades", eps=0.3)["beta"] == 3.0  # the sweep's choice (docs/RESULTS.md)
    f = harden_settings("fosc", eps=0.3)
    assert f["fosc_c_max"] == 0.5 and f["fosc_warmup"] == 0.8
    assert "beta" not in harden_settings("fol-budget", eps=0.3)


def test_harden_has_one_home():
    """harden is imported from robustest.train only: robustest.train.fitting does not re-export it."""
    assert not hasattr(fitting, "harden")


def test_harden_stops_with_one_line_when_the_loss_is_not_finite(exploding_model) -> None:
    from robustest.core.errors import TrainingDiverged

    x, y = torch.rand(16, 1, 8, 8), torch.arange(16) % 3
    with pytest.raises(TrainingDiverged, match=r"harden diverged: the pgd-at loss is nan"):
        harden(exploding_model, (x, y), method="pgd-at", eps=0.1, epochs=1, progress=False)


def _held_by_hand(labels: torch.Tensor, shares: list[int], seed: int) -> list[int]:
    """Within each class the ``shares[c]`` samples with the smallest keys of the seeded draw, sorted."""
    from robustest.core.seeding import derive_seed, make_generator

    key = torch.rand(len(labels), generator=make_generator(derive_seed(seed, "holdout")))
    held = []
    for c, share in enumerate(shares):
        members = (labels == c).nonzero().flatten()
        held += members[torch.argsort(key[members])[:share]].tolist()
    return sorted(held)


def test_holdout_split_shares_by_largest_remainder_and_draws_by_the_seed():
    labels = torch.tensor([0] * 6 + [1] * 3 + [2] * 1)
    # k = 5 of 10: exact shares 3, 1.5, 0.5 -> floors 3, 1, 0 and the one left to class 1 (the tie: smaller index)
    for seed in (0, 1):
        train, val = early_stopping.holdout_split(labels, 5, seed=seed)
        assert torch.bincount(labels[val], minlength=3).tolist() == [3, 2, 0]
        assert val.tolist() == _held_by_hand(labels, [3, 2, 0], seed)
        assert train.tolist() == sorted(set(range(10)) - set(val.tolist()))
    assert not torch.equal(early_stopping.holdout_split(labels, 5, seed=0)[1],
                           early_stopping.holdout_split(labels, 5, seed=1)[1])
    # classes in another order of labels: the class comes first, then the key
    mixed = torch.tensor([2, 0, 1, 0, 1, 0, 2, 1, 0, 0])
    _, val = early_stopping.holdout_split(mixed, 4, seed=3)  # shares 2, 1.2, 0.8 -> 2, 1, 1
    assert val.tolist() == _held_by_hand(mixed, [2, 1, 1], 3)


def test_holdout_split_bounds():
    labels = torch.tensor([0, 1, 0, 1])
    train, val = early_stopping.holdout_split(labels, 0)
    assert train.tolist() == [0, 1, 2, 3] and val.tolist() == []
    train, val = early_stopping.holdout_split(labels, 4)
    assert train.tolist() == [] and val.tolist() == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="cannot hold out 5 of 4 samples"):
        early_stopping.holdout_split(labels, 5)
    with pytest.raises(ConfigError, match="^k must be an integer >= 0, got -1$"):
        early_stopping.holdout_split(labels, -1)
    many = torch.arange(40) % 3
    assert all(torch.equal(a, b) for a, b in zip(early_stopping.holdout_split(many, 7),
                                                 early_stopping.holdout_split(many, 7, seed=0)))  # the default seed


def test_validation_split_holds_out_a_stratified_tenth_at_most():
    from robustest.train.early_stopping import DEFAULT_VAL_SIZE, holdout_split, validation_split

    x, y = torch.arange(200.0).reshape(200, 1, 1, 1), torch.arange(200) % 4
    fit_data, val, k = validation_split((x, y), None, seed=3)
    assert k == 20 == min(DEFAULT_VAL_SIZE, 200 // 10) and val[1].bincount().tolist() == [5, 5, 5, 5]
    tr, va = holdout_split(y, 20, 3)
    assert torch.equal(val[0], x[va]) and torch.equal(fit_data[0], x[tr])
    assert validation_split((x, y), 0, keep="last") == ((x, y), None, 0)
    assert validation_split((x, y), 20)[2] == 20  # exactly a tenth
    with pytest.raises(ConfigError, match="--val-size 21 is more than a tenth of the 200 training images"):
        validation_split((x, y), 21)
    with pytest.raises(ConfigError, match="9 training images are too few"):
        validation_split((x[:9], y[:9]), None, keep="best")
    assert validation_split((x[:9], y[:9]), None, keep="last")[1:] == (None, 0)
    with pytest.raises(ConfigError, match="too few"):  # keep="best" is the default
        validation_split((x[:9], y[:9]), None)
    assert torch.equal(validation_split((x, y), 20)[1][0], x[holdout_split(y, 20, 0)[1]])  # seed 0 by default


def test_validation_split_reads_the_labels_through_the_batches_of_a_dataset_without_a_label_tensor():
    from torch.utils.data import Dataset

    from robustest.train.early_stopping import holdout_split, validation_split

    class Items(Dataset):
        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int):
            return torch.full((1, 1, 1), float(i)), i % 2

    _, val, k = validation_split(Items(), 4, seed=1)
    want = holdout_split(torch.arange(40) % 2, 4, 1)[1]
    assert k == 4 and val[0].flatten().tolist() == want.float().tolist() and val[1].tolist() == (want % 2).tolist()


def test_harden_takes_one_recipe_sgd_without_nesterov_unless_asked():
    s = harden_settings("pgd-at", eps=EPS, recipe=Recipe(optimizer="sgd", lr=0.05, schedule="cosine"))
    assert {k: s[k] for k in ("optimizer", "lr", "momentum", "nesterov", "schedule", "weight_decay")} == {
        "optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": False, "schedule": "cosine", "weight_decay": 0.0}
    assert harden_settings("pgd-at", eps=EPS, recipe=Recipe(optimizer="sgd", nesterov=True))["nesterov"] is True
    adam = harden_settings("pgd-at", eps=EPS)
    assert "momentum" not in adam and "nesterov" not in adam  # Adam records no SGD option
    assert harden_settings("pgd-at", eps=EPS, recipe=Recipe(decay_norm_bias=True)) == adam  # a default is not "set"
    with pytest.raises(TypeError, match=r"^lr is a training recipe option: pass recipe=Recipe\(lr=\.\.\.\) "
                                        r"\(robustest.train.recipes.Recipe\)$"):
        harden_settings("pgd-at", eps=EPS, lr=0.1)
    with pytest.raises(ConfigError, match=r"^harden does not take the recipe option amp \(it honours optimizer, lr, "
                                          r"weight_decay, momentum, nesterov, schedule, warmup_epochs, milestones\): "
                                          r"leave it unset$"):
        harden_settings("pgd-at", eps=EPS, recipe=Recipe(amp="bf16", compile=True))
