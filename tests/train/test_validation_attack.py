"""The validation attack of robust early stopping and the catastrophic-overfitting guard: PGD or APGD-CE
(robustest.train.early_stopping.validate, harden's ``val_attack``, ``robustest harden --val-attack``)."""

from __future__ import annotations

import copy
import json

import pytest

from robustest import attacks
from robustest.cli import main
from robustest.core.errors import ConfigError
from robustest.train import early_stopping, harden, harden_settings

EPS = 0.15


@pytest.fixture
def split(trained_digits_model, digits_train, digits_test):
    """(model, training pair of 96 images, validation pair of 40)."""
    x, y = digits_train.tensors
    xv, yv = digits_test.tensors
    return trained_digits_model, (x[:96], y[:96]), (xv[:40], yv[:40])


@pytest.mark.parametrize("name, key, kw", [
    ("pgd", "val_pgd_accuracy", {"alpha": EPS / 4, "random_start": True}),
    ("apgd-ce", "val_apgd_accuracy", {}),
])
def test_validate_runs_the_named_attack(name, key, kw, split):
    model, _, (xv, yv) = split
    got = early_stopping.validate(model, xv, yv, EPS, 1, seed=3, attack=name)
    fn = "pgd" if name == "pgd" else "apgd"
    ref = attacks.attack(fn, model, (xv, yv), eps=EPS, steps=1, seed=3, **kw)
    assert got == {"val_clean_accuracy": ref.clean_accuracy, key: ref.robust_accuracy}
    # one step from seed 3 reads differently from 100 steps or from seed 0, so both arguments are seen to arrive
    assert ref.robust_accuracy != attacks.attack(fn, model, (xv, yv), eps=EPS, steps=100, seed=3, **kw).robust_accuracy
    assert ref.robust_accuracy != attacks.attack(fn, model, (xv, yv), eps=EPS, steps=1, seed=0, **kw).robust_accuracy
    assert early_stopping.VAL_ATTACKS[name] == early_stopping.val_key(name) == key


def test_apgd_validation_is_no_weaker_than_pgd_on_a_digits_model(split):
    """The point of the option: at the same number of steps APGD-CE finds at least what PGD of step eps/4 finds."""
    model, _, (xv, yv) = split
    pgd = early_stopping.validate(model, xv, yv, EPS, 10, seed=0)["val_pgd_accuracy"]
    apgd = early_stopping.validate(model, xv, yv, EPS, 10, seed=0, attack="apgd-ce")["val_apgd_accuracy"]
    assert apgd <= pgd and apgd < 1.0


@pytest.mark.parametrize("method, default", [("pgd-at", "pgd"), ("trades", "pgd"), ("fol-budget", "pgd"),
                                             ("fast-at", "apgd-ce"), ("n-fgsm", "apgd-ce"), ("grad-align", "apgd-ce")])
def test_single_step_methods_validate_with_apgd_by_default(method, default):
    assert harden_settings(method)["val_attack"] == default
    assert harden_settings(method, val_attack="pgd")["val_attack"] == "pgd"
    assert harden_settings(method, val_attack="apgd-ce")["val_attack"] == "apgd-ce"


def test_an_unknown_validation_attack_is_refused_before_any_work(split):
    model, train, val = split
    calls = []
    with pytest.raises(ConfigError, match="unknown validation attack 'fgsm': use one of pgd, apgd-ce"):
        harden(copy.deepcopy(model), train, "pgd-at", eps=EPS, epochs=1, val=val, val_attack="fgsm",
               on_epoch_end=lambda *a: calls.append(a))
    assert calls == []
    with pytest.raises(ConfigError, match="unknown validation attack 'fgsm'"):
        early_stopping.validate(model, *val, EPS, 2, seed=0, attack="fgsm")


def _scripted(monkeypatch, pgd, apgd):
    """harden's validation returns both scores, one per epoch; the attack it was asked for is recorded."""
    asked = []
    it = iter(zip(pgd, apgd))

    def fake(model, x, y, eps, steps, seed, attack="pgd"):
        asked.append(attack)
        p, a = next(it)
        return {"val_clean_accuracy": 0.9, "val_pgd_accuracy": p, "val_apgd_accuracy": a}

    monkeypatch.setattr(early_stopping, "validate", fake)
    return asked


def test_the_apgd_score_picks_the_kept_epoch(split, monkeypatch):
    model, train, val = split
    asked = _scripted(monkeypatch, pgd=[0.9, 0.1, 0.95], apgd=[0.3, 0.5, 0.4])
    res = harden(copy.deepcopy(model), train, "pgd-at", eps=EPS, epochs=3, steps=1, val=val, val_attack="apgd-ce")
    assert asked == ["apgd-ce"] * 3
    assert res.best_epoch == res.kept_epoch == 2
    asked = _scripted(monkeypatch, pgd=[0.9, 0.1, 0.95], apgd=[0.3, 0.5, 0.4])
    res = harden(copy.deepcopy(model), train, "pgd-at", eps=EPS, epochs=3, steps=1, val=val)
    assert asked == ["pgd"] * 3 and res.kept_epoch == 3  # the default still scores by PGD


def test_the_guard_watches_the_apgd_score(split, monkeypatch):
    model, train, val = split
    _scripted(monkeypatch, pgd=[0.40, 0.45, 0.44, 0.5], apgd=[0.40, 0.45, 0.20, 0.5])  # 0.20 < 0.45 / 2
    res = harden(copy.deepcopy(model), train, "fast-at", eps=EPS, epochs=4, val=val, keep="last",
                 val_attack="apgd-ce")
    assert res.guard_epoch == 3 and res.epochs[-1]["guard"] == "collapsed" and res.kept_epoch == 2


def test_resume_refuses_another_validation_attack(split, tmp_path):
    model, train, val = split
    kw = {"eps": EPS, "epochs": 2, "steps": 1, "val": val, "val_steps": 2, "state_dir": tmp_path}

    class Stop(Exception):
        pass

    def interrupt(epoch, m, record):
        raise Stop

    with pytest.raises(Stop):
        harden(copy.deepcopy(model), train, "pgd-at", **kw, on_epoch_end=interrupt)
    with pytest.raises(ConfigError, match="holds a run with other settings or data"):
        harden(copy.deepcopy(model), train, "pgd-at", **kw, val_attack="apgd-ce", resume=True)
    res = harden(copy.deepcopy(model), train, "pgd-at", **kw, resume=True)
    assert res.resumed_epochs == 1 and len(res.epochs) == 2
    # without validation data the validation steps do nothing, and a resume does not ask for them
    kw = {**kw, "val": None, "state_dir": tmp_path / "noval"}
    with pytest.raises(Stop):
        harden(copy.deepcopy(model), train, "pgd-at", **kw, on_epoch_end=interrupt)
    res = harden(copy.deepcopy(model), train, "pgd-at", **{**kw, "val_steps": 7}, resume=True)
    assert res.resumed_epochs == 1 and len(res.epochs) == 2


def test_cli_records_and_reports_the_validation_attack(mlp_digits_checkpoint, tmp_path):
    out = tmp_path / "h"
    assert main(["harden", "--checkpoint", mlp_digits_checkpoint, "--dataset", "digits", "--eps", "0.1",
                 "--epochs", "1", "--steps", "1", "--limit", "200", "--val-size", "20", "--val-attack", "apgd-ce",
                 "--val-steps", "2", "--test-limit", "20", "--whitebox-limit", "0", "--no-progress", "--quiet",
                 "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["settings"]["val_attack"] == "apgd-ce" and res["settings"]["val_steps"] == 2
    epoch = res["epochs"][0]
    assert "val_pgd_accuracy" not in epoch and 0.0 <= epoch["val_apgd_accuracy"] <= 1.0
    html = (out / "report.html").read_text()
    assert "APGD-CE-2 after every epoch" in html and "validation APGD-CE" in html


def test_cli_refuses_an_unknown_validation_attack(capsys):
    with pytest.raises(SystemExit) as info:
        main(["harden", "--dataset", "digits", "--model", "digits_cnn", "--from-scratch", "--eps", "0.1",
              "--val-attack", "fgsm", "--out", "x"])
    assert info.value.code == 2 and "invalid choice: 'fgsm'" in capsys.readouterr().err

