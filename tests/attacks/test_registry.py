"""The attack registry (robustest.attacks.registry): each attack's record carries its metadata, and an attack
registered from outside the package runs by name in attack(), evaluate() and the generate verb."""

from __future__ import annotations

import json

import pytest
import torch

from robustest import attacks
from robustest import evaluate as ev
from robustest.attacks import Attack
from robustest.cli import main
from robustest.core.errors import ConfigError


def shift(model, x, y, eps, steps: int = 3, seed=None, *, batch_size=None, generator=None):
    """A toy L-inf attack: every pixel moved by +eps (clipped), whatever the model."""
    return (x + eps).clamp(0, 1)


SHIFT = Attack("shift", shift, "every pixel + eps (a test attack)", norms=("linf",), default_steps=3,
               aliases=("plus_eps",))


def test_the_built_in_records_carry_what_other_packages_read():
    rec = {n: attacks.get(n) for n in attacks.names()}
    assert {n for n, r in rec.items() if r.norms == ("linf",)} == {"fgsm", "bim", "rfgsm", "mifgsm"}
    assert [n for n, r in rec.items() if r.norms == ("l2",)] == ["cw_l2"]
    assert [n for n, r in rec.items() if not r.norm_bounded] == ["cw_l2"]
    assert {n: r.min_classes for n, r in rec.items() if r.min_classes > 2} == {"apgd_dlr": 3, "apgd_t": 4}
    assert {n for n, r in rec.items() if r.scale_free} == {"apgd_dlr", "apgd_t", "fab", "fab_t", "square"}
    assert {n: r.default_steps for n, r in rec.items()} == {
        "apgd": 100, "apgd_dlr": 100, "apgd_t": 100, "bim": 10, "cw_l2": 100, "fab": 100, "fab_t": 100,
        "fgsm": None, "mifgsm": 10, "pgd": 10, "rfgsm": 1, "square": None}
    assert attacks.canonical_name("APGD-CE") == "apgd" and attacks.canonical_name("cw") == "cw_l2"
    with pytest.raises(ConfigError, match="^unknown attack 'nope': choose one of "):
        attacks.canonical_name("nope")


@pytest.mark.parametrize("kw, message", [
    ({"fn": 3}, "attack 'bad': fn must be callable, got 3"),
    ({"norms": ("l1",)}, "attack 'bad': norms must be some of linf, l2, got ('l1',)"),
    ({"norms": ()}, "attack 'bad': norms must be some of linf, l2, got ()"),
    ({"min_classes": 1}, "attack 'bad': min_classes must be an integer >= 2, got 1"),
    ({"min_classes": True}, "attack 'bad': min_classes must be an integer >= 2, got True"),
])
def test_a_malformed_record_is_refused_with_one_line(kw, message):
    with pytest.raises(ConfigError) as exc:
        Attack(**{"name": "bad", "fn": shift, "description": "d", **kw})
    assert str(exc.value) == message


def test_register_unregister_and_the_registered_context():
    assert "shift" not in attacks.names()
    with attacks.registered(SHIFT) as rec:
        assert rec is SHIFT and "shift" in attacks.names() and attacks.get("PLUS-EPS") is SHIFT
        assert attacks.describe("shift") == "every pixel + eps (a test attack)"
        with pytest.raises(ConfigError, match="already registered"):
            attacks.register(SHIFT)
    assert "shift" not in attacks.names() and "plus_eps" not in attacks.ATTACKS
    attacks.register(SHIFT)
    try:
        assert attacks.attack_function("shift") is shift
    finally:
        assert attacks.unregister("shift") is SHIFT
    with pytest.raises(ConfigError, match="^register takes a robustest.attacks.Attack, got function$"):
        attacks.register(shift)  # type: ignore[arg-type]


def test_a_registered_attack_runs_in_attack_and_in_a_custom_evaluation():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3)).eval()
    x, y = torch.full((5, 1, 2, 2), 0.5), torch.tensor([0, 1, 2, 0, 1])
    with attacks.registered(SHIFT):
        r = attacks.attack("shift", model, x, y, eps=0.1)
        assert r.name == "shift" and torch.allclose(r.adv, torch.full_like(x, 0.6))
        res = ev.evaluate(model, (x, y), 0.1, version="custom", attacks=["shift"])
        assert list(res.attacks)[0] == "shift"  # then the square probe every custom plan gets
        with pytest.raises(ConfigError, match=r"^attack 'shift' is L-inf only: use it with norm='linf'$"):
            ev.evaluate(model, (x, y), 0.5, norm="l2", version="custom", attacks=["shift"])
    picky = Attack("picky", shift, "needs 5 classes", min_classes=5)
    with attacks.registered(picky), pytest.raises(ConfigError, match="^picky needs a model with at least 5 "
                                                                      "classes, this one has 3$"):
        ev.evaluate(model, (x, y), 0.1, version="custom", attacks=["picky"])


def test_the_generate_verb_runs_a_registered_attack_and_refuses_flags_it_does_not_take(tmp_path, capsys,
                                                                                       trained_digits_model):
    from robustest.models.checkpoints import save_checkpoint

    ckpt = tmp_path / "m.pt"
    save_checkpoint(ckpt, trained_digits_model)
    base = ["generate", "--checkpoint", str(ckpt), "--dataset", "digits", "--limit", "10", "--no-progress"]
    with attacks.registered(SHIFT):
        assert main([*base, "--method", "shift", "--eps", "0.2", "--keep-all", "--out", str(tmp_path / "o")]) == 0
        settings = json.loads((tmp_path / "o" / "results.json").read_text())["settings"]
        assert settings["method"] == "shift" and settings["steps"] == 3 and settings["eps"] == 0.2
        assert main([*base, "--method", "shift", "--alpha", "0.1", "--out", str(tmp_path / "a")]) == 2
        assert "--alpha does not apply to shift" in capsys.readouterr().err
        assert main([*base, "--method", "shift", "--norm", "l2", "--out", str(tmp_path / "n")]) == 2
        assert "--norm l2 is not a threat model of shift (it runs in linf)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--method", "shift", "--out", str(tmp_path / "gone")])
    assert "unknown method 'shift': choose an attack (apgd, " in capsys.readouterr().err
