"""The guard's third rule, "overstated": a single-step run that goes wrong slowly, its short validation attack
reading it a few points under the best while APGD-CE with ten times the iterations finds far less
(robustest.train.early_stopping.short_long / overstated, applied by harden in epochs at the full radius)."""

from __future__ import annotations

import copy

import pytest
import torch

from robustest import data, models
from robustest.attacks import AttackResult
from robustest.core.seeding import derive_seed
from robustest.train import early_stopping, harden

EPS = 0.15


@pytest.fixture(scope="module")
def digits():
    """(train, validation): the first 96 digits training images and the first 60 test images."""
    tr, te = data.load("digits", split="train"), data.load("digits", split="test")
    return (tr.tensors[0][:96], tr.tensors[1][:96]), (te.tensors[0][:60], te.tensors[1][:60])


@pytest.fixture()
def model():
    torch.manual_seed(0)
    return models.create("digits_cnn", input_size=8)


def _fake(success: list[bool]) -> AttackResult:
    """An attack's outcome on len(success) images with the given per-image success."""
    n = len(success)
    s = torch.tensor(success)
    z = torch.zeros(n, dtype=torch.long)
    return AttackResult(name="apgd", adv=torch.zeros(n, 1, 8, 8), y=z, success=s,
                        clean_correct=torch.ones(n, dtype=torch.bool), clean_pred=z, adv_pred=s.long(),
                        linf=torch.zeros(n), l2=torch.zeros(n))


@pytest.mark.parametrize("short, long, fires", [
    (0.8, 0.7, True),      # exactly CO_LONG_GAP apart counts (0.8 - 0.7 is 0.1000...09 in floats)
    (0.9, 0.8, True),      # and so does 0.9 - 0.8 (0.0999...98 in floats)
    (0.8, 0.705, False), (0.5, 0.0, True), (0.7, 0.8, False), (0.83, 0.83, False),
])
def test_overstated_rule(short, long, fires):
    assert early_stopping.CO_LONG_GAP == 0.1
    assert early_stopping.overstated(short, long) is fires


def test_short_long_runs_apgd_ce_twice_on_evenly_spaced_images_and_takes_the_worse_per_image(model, monkeypatch):
    """Four of six images, rows i * 6 // 4 = 0, 1, 3, 4 (data ordered by class keeps every class's share). The long
    attack counts an image as broken if either run broke it: here the short run breaks the first, the long one the
    second and third (not the first): short 3/4, long 1/4 (the long run alone would say 2/4)."""
    import robustest.attacks

    monkeypatch.setattr(early_stopping, "CO_LONG_SIZE", 4)
    calls = []
    outcomes = {3: [True, False, False, False], 30: [False, True, True, False]}

    def fake(name, m, xy, **kw):
        calls.append((name, xy[0].shape[0], xy[1].tolist(), kw))
        return _fake(outcomes[kw["steps"]])

    monkeypatch.setattr(robustest.attacks, "attack", fake)
    x, y = torch.rand(6, 1, 8, 8), torch.arange(6)
    got = early_stopping.short_long(model, x, y, 0.2, 3, seed=7)
    assert got == {"val_short_accuracy": 0.75, "val_long_accuracy": 0.25}
    assert calls == [("apgd", 4, [0, 1, 3, 4], {"eps": 0.2, "steps": 3, "seed": 7}),
                     ("apgd", 4, [0, 1, 3, 4], {"eps": 0.2, "steps": 30, "seed": 7})]
    calls.clear()
    early_stopping.short_long(model, x[:3], y[:3], 0.2, 3, seed=7)  # fewer images than CO_LONG_SIZE: all of them
    assert [c[2] for c in calls] == [[0, 1, 2]] * 2


def test_short_long_on_a_real_model_is_deterministic_and_the_long_reads_no_higher(model, digits):
    _, (xv, yv) = digits
    a = early_stopping.short_long(model, xv, yv, EPS, 2, seed=3)
    assert a == early_stopping.short_long(model, xv, yv, EPS, 2, seed=3)
    assert 0.0 <= a["val_long_accuracy"] <= a["val_short_accuracy"] <= 1.0
    real = early_stopping.validate(model, xv, yv, EPS, 2, 3, "apgd-ce")  # the short run is validate's APGD-CE
    assert a["val_short_accuracy"] == real["val_apgd_accuracy"]  # (60 images: fewer than CO_LONG_SIZE, all taken)


def _script(monkeypatch, scores, gaps):
    """Validation returns ``scores`` (the accuracy of the attack asked for, one per epoch), the short-long check
    short 0.8 and long 0.8 - gap (one per epoch in which it runs); returns the list of the check's calls."""
    it, gap_it, calls = iter(scores), iter(gaps), []
    monkeypatch.setattr(early_stopping, "validate", lambda *a, **k: {
        "val_clean_accuracy": 0.9, early_stopping.VAL_ATTACKS[a[6]]: next(it)})

    def check(m, x, y, eps, steps, seed):
        calls.append((eps, steps, seed))
        return {"val_short_accuracy": 0.8, "val_long_accuracy": 0.8 - next(gap_it)}

    monkeypatch.setattr(early_stopping, "short_long", check)
    return calls


def test_harden_stops_where_the_long_attack_finds_much_less_and_keeps_the_best(model, digits, monkeypatch):
    (x, y), val = digits
    calls = _script(monkeypatch, [0.5, 0.6, 0.55, 0.6], [0.05, 0.12, 0.0])
    res = harden(copy.deepcopy(model), (x, y), "fast-at", eps=EPS, epochs=4, val=val, eps_warmup=0.25, batch_size=32,
                 val_steps=4, keep="last", seed=5)
    # epoch 1 trains inside the warm-up: no check; epochs 2-3 at the full radius, the third epoch's gap fires
    assert calls == [(EPS, 4, derive_seed(5, "val-long"))] * 2
    assert "val_short_accuracy" not in res.epochs[0]
    assert [r.get("val_long_accuracy") for r in res.epochs[1:]] == [pytest.approx(0.75), pytest.approx(0.68)]
    assert res.guard_epoch == 3 and len(res.epochs) == 3 and res.epochs[-1]["guard"] == "overstated"
    assert res.best_epoch == res.kept_epoch == 2 and res.last_weights is not None


def test_no_check_without_the_guard_or_for_a_multi_step_method(model, digits, monkeypatch):
    (x, y), val = digits
    for method, kw in (("fast-at", {"co_guard": False}), ("pgd-at", {"steps": 1})):
        calls = _script(monkeypatch, [0.5, 0.6], [0.5, 0.5])
        res = harden(copy.deepcopy(model), (x, y), method, eps=EPS, epochs=2, val=val, eps_warmup=0.0, batch_size=32,
                     **kw)
        assert calls == [] and res.guard_epoch is None and len(res.epochs) == 2
        assert all("val_long_accuracy" not in r for r in res.epochs)


def test_masked_comes_first_and_skips_the_check(model, digits, monkeypatch):
    (x, y), val = digits
    calls = _script(monkeypatch, [0.5], [0.5])
    monkeypatch.setattr(early_stopping, "masked", lambda adv, score: True)
    res = harden(copy.deepcopy(model), (x, y), "n-fgsm", eps=EPS, epochs=2, val=val, eps_warmup=0.0, batch_size=32)
    assert calls == [] and res.guard_epoch == 1 and res.epochs[0]["guard"] == "masked"
