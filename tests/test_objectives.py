"""Hardening objectives behind a registry (robustest.train.objectives): a new method defined outside the package
runs through harden, its option is checked like the built-ins' and the registry forgets it afterwards."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from robustest.core.errors import ConfigError
from robustest.core.modelcall import eval_mode, forward, frozen_params
from robustest.train import harden, harden_settings, objectives
from robustest.train.checks import check_number
from robustest.train.compute import ComputeCount
from robustest.train.objectives import Objective, Option, StepContext, StepOutput


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
    options=(Option("noise_scale", 1.0, lambda v, n: check_number(v, n, lo=0.0, hi=1.0, lo_open=True),
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
        with pytest.raises(ConfigError, match="noise_scale must lie in"):
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
    with pytest.raises(ConfigError, match="lower case"):
        objectives.register(Objective(name="Plain_Copy", step=objectives.get("pgd-at").step))


def test_the_harden_verb_offers_the_registry(capsys):
    from robustest.cli import main

    with objectives.registered(NOISE):
        with pytest.raises(SystemExit):
            main(["harden", "--help"])
    text = capsys.readouterr().out
    assert "noise-at" in text and "--noise-scale" in text and "--fol-threshold" in text
    assert "noise-at" not in objectives.names()
