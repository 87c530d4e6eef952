"""Training objectives behind a registry (robustest.train.objectives): a new method defined outside the package
runs through harden, its option is checked like the built-ins' and the registry forgets it afterwards; fit and
enhance compute their loss with the registry's cross-entropy and augmix-jsd-adv, which harden does not offer."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from robustest.core.compute import ComputeCount
from robustest.core.errors import ConfigError
from robustest.core.modelcall import eval_mode, forward, frozen_params
from robustest.core.options import checked_option
from robustest.core.validation import check_float
from robustest.train import harden, harden_settings, objectives
from robustest.train.objectives import Objective, StepContext, StepOutput
from robustest.train.recipes import Recipe


def _noise_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator,
                ctx: StepContext) -> StepOutput:
    """Train on uniform noise of ``noise_scale * eps`` around the images: no gradient steps, one forward each."""
    scale = ctx.settings["noise_scale"]
    with eval_mode(model), frozen_params(model):
        noise = torch.rand(x.shape, generator=gen, device=x.device).mul_(2 * scale * ctx.eps).sub_(scale * ctx.eps)
        adv = (x + noise).clamp_(0.0, 1.0)
    model.train()
    logits = forward(model, adv)
    b = x.shape[0]
    evals = torch.zeros(b, dtype=torch.long, device=x.device)
    return StepOutput(F.cross_entropy(logits, y), logits, evals, ComputeCount(train_forward=b, train_backward=b))


NOISE = Objective(
    name="noise-at", step=_noise_step, summary="training on uniform noise in the ball (a test objective)",
    options=(checked_option("noise_scale", 1.0, lambda v, n: check_float(n, v, lo=0.0, hi=1.0, lo_open=True),
                            "width of the noise as a fraction of eps"),),
    alpha=lambda eps, steps: eps, alpha_doc="eps",
)


@pytest.fixture
def few_digits(digits_train):
    x, y = digits_train.tensors
    return x[:96], y[:96]


def test_a_new_objective_registered_from_outside_runs_through_harden(digits_model, few_digits):
    assert "noise-at" not in objectives.names()
    with objectives.registered(NOISE):
        assert objectives.names()[-1] == "noise-at" and objectives.get("noise_at") is NOISE
        model = copy.deepcopy(digits_model)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        res = harden(model, few_digits, "noise-at", eps=0.1, epochs=2, batch_size=32, noise_scale=0.5, seed=1)
        assert res.method == "noise-at" and res.settings["noise_scale"] == 0.5
        assert res.settings["steps"] == 10 and res.settings["alpha"] == pytest.approx(0.1)
        assert [e["epoch"] for e in res.epochs] == [1, 2] and not model.training
        assert res.compute["passes"] == pytest.approx(2 * 96) and res.compute["attack_passes"] == 0
        assert all(e["attack_evals_mean"] == 0 and e["stopped_early"] == 0 for e in res.epochs)
        assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
        # the same seed draws the same noise: the same weights
        again = copy.deepcopy(digits_model)
        harden(again, few_digits, "noise-at", eps=0.1, epochs=2, batch_size=32, noise_scale=0.5, seed=1)
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
        # its option is checked and owned like a built-in's
        assert harden_settings("noise-at", eps=0.1)["noise_scale"] == 1.0
        with pytest.raises(ConfigError, match=r"^noise_scale must be a number in \(0, 1\], got 2.0$"):
            harden_settings("noise-at", eps=0.1, noise_scale=2.0)
        with pytest.raises(ConfigError, match="noise_scale applies to method noise-at only, not 'pgd-at'"):
            harden_settings("pgd-at", eps=0.1, noise_scale=0.5)
        with pytest.raises(ConfigError, match="already registered"):
            objectives.register(NOISE)
    assert "noise-at" not in objectives.names()
    with pytest.raises(ConfigError, match="unknown harden method 'noise-at'"):
        harden(copy.deepcopy(digits_model), few_digits, "noise-at", eps=0.1, epochs=1)
    with pytest.raises(TypeError, match="noise_scale"):
        harden_settings("pgd-at", eps=0.1, noise_scale=0.5)


def test_register_and_unregister_by_hand():
    obj = objectives.register(Objective(name="plain-copy", step=objectives.get("pgd-at").step))
    try:
        assert "plain-copy" in objectives.names() and objectives.option_owners()["mix"][0] == ("pgd-at",)
    finally:
        assert objectives.unregister("plain-copy") is obj
    assert "plain-copy" not in objectives.names()
    with pytest.raises(ConfigError, match="unknown harden method"):
        objectives.unregister("plain-copy")
    with pytest.raises(ConfigError, match="^training objective names are spelled 'plain-copy', got 'Plain_Copy'$"):
        objectives.register(Objective(name="Plain_Copy", step=objectives.get("pgd-at").step))


def test_the_harden_verb_offers_the_registry(capsys):
    from robustest.cli import main

    with objectives.registered(NOISE):
        with pytest.raises(SystemExit):
            main(["harden", "--help"])
    text = capsys.readouterr().out
    assert "noise-at" in text and "--noise-scale" in text and "--fol-threshold" in text
    assert "noise-at" not in objectives.names()


# ------------------------------------------------------------------------------- the other loops' objectives
def _calls_and_zero_loss(name: str, calls: list[StepContext], restores: list[int] | None = None) -> Objective:
    """A stand-in for the registry's ``name``: the original step, its loss times 0 (no update: Adam's step on a
    zero gradient is 0), every call's context recorded (and, with ``restores``, every call of its ``restore``)."""
    original = objectives.get(name)

    def step(model, x, y, gen, ctx):
        calls.append(ctx)
        out = original.step(model, x, y, gen, ctx)
        restore = None if restores is None else (lambda: restores.append(len(calls)))
        return StepOutput(out.loss * 0.0, out.logits, out.evals, out.compute, restore=restore)

    return Objective(name=name, step=step, harden_method=False)


def test_the_registry_holds_fit_and_enhance_objectives_but_harden_offers_neither(digits_model, few_digits):
    import robustest.weakrobust  # noqa: F401 - registers enhance's objective

    every = objectives.names(harden_only=False)
    assert {"cross-entropy", "augmix-jsd-adv"} <= set(every)
    assert objectives.names() == ("pgd-at", "trades", "fosc", "fol-budget", "fast-at", "n-fgsm", "grad-align",
                                  "gaussian-noise", "ibp", "crown-ibp")
    assert all(not objectives.get(n).harden_method for n in ("cross-entropy", "augmix-jsd-adv"))
    assert set(objectives.option_owners()) == {o.name for n in objectives.names() for o in objectives.get(n).options}
    with pytest.raises(ConfigError, match="unknown harden method 'cross-entropy' .*another loop.*: choose one of "
                                          "pgd-at, trades, fosc, fol-budget, fast-at, n-fgsm, grad-align, "
                                          "gaussian-noise, ibp, "
                                          "crown-ibp$"):
        harden_settings("cross-entropy", eps=0.1)
    with pytest.raises(ConfigError, match=r"unknown harden method 'augmix_jsd_adv' \(augmix-jsd-adv is"):
        harden(copy.deepcopy(digits_model), few_digits, "augmix_jsd_adv", eps=0.1, epochs=1)


def test_the_cross_entropy_objective_is_fit_s_loss(digits_model, few_digits):
    x, y = few_digits
    ctx = StepContext({"label_smoothing": 0.1, "amp": None})
    out = objectives.get("cross-entropy").step(digits_model, x, y, None, ctx)
    logits = forward(digits_model, x)
    assert torch.equal(out.logits, logits) and torch.equal(out.loss, F.cross_entropy(logits, y, label_smoothing=0.1))
    assert out.compute.train_forward == out.compute.train_backward == 96 and out.compute.attack_forward == 0
    assert torch.equal(out.evals, torch.zeros(96, dtype=torch.long))


def test_fit_computes_its_loss_with_the_registry_s_cross_entropy(digits_model, few_digits):
    from robustest.train import fit

    original = objectives.get("cross-entropy")
    start = copy.deepcopy(digits_model).state_dict()
    calls: list[StepContext] = []
    restores: list[int] = []
    with objectives.registered(_calls_and_zero_loss("cross-entropy", calls, restores), replace=True):
        model = copy.deepcopy(digits_model)
        hist = fit(model, few_digits, epochs=2, batch_size=32, recipe=Recipe(label_smoothing=0.1), progress=False)
    assert len(calls) == 6 and calls[0].settings["label_smoothing"] == 0.1
    assert restores == [1, 2, 3, 4, 5, 6]  # each step's restore, after its update
    assert all(torch.equal(start[k], v) for k, v in model.state_dict().items())  # the stand-in's zero loss
    assert [e.loss for e in hist.epochs] == [0.0, 0.0]
    assert objectives.get("cross-entropy") is original  # back after the block
    trained = copy.deepcopy(digits_model)
    fit(trained, few_digits, epochs=2, batch_size=32, recipe=Recipe(label_smoothing=0.1), progress=False)
    assert any(not torch.equal(start[k], v) for k, v in trained.state_dict().items())


def test_enhance_computes_its_loss_with_the_registry_s_objective(digits_model, few_digits):
    from robustest import weakrobust as wr

    original = objectives.get("augmix-jsd-adv")
    start = copy.deepcopy(digits_model).state_dict()
    calls: list[StepContext] = []
    restores: list[int] = []
    with objectives.registered(_calls_and_zero_loss("augmix-jsd-adv", calls, restores), replace=True):
        model = copy.deepcopy(digits_model)
        res = wr.enhance(model, few_digits, ["fog"], epochs=1, adv_steps=2, batch_size=32, adv_source="online")
    assert restores == [1, 2, 3]
    assert len(calls) == 3 and calls[0].settings["jsd_weight"] == 6.0 and calls[0].eps == res.config["eps"]
    assert {"rng", "ops", "adv", "attack_model", "attack_seed"} <= set(calls[0].extra)
    assert all(torch.equal(start[k], v) for k, v in model.state_dict().items())
    assert res.epochs[0]["loss"] == 0.0 and res.epochs[0]["ce"] == res.epochs[0]["jsd"] == 0.0  # no terms given
    assert objectives.get("augmix-jsd-adv") is original
