"""Adversarial weight perturbation (train/objectives/awp.py) as a modifier of pgd-at and trades: the perturbation's
exact value on a linear model (``gamma * ||W|| * g / ||g||`` per weight matrix, biases left alone), when it is
active (gamma, warm-up), that it leaves batch-norm statistics and the mode alone, that the step's loss is taken at
the perturbed weights and the loop takes the perturbation back after the optimiser's step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.errors import ConfigError
from robustest.train import harden, harden_settings
from robustest.train.objectives import StepContext, awp, inner, pgd_at, trades
from robustest.train.recipes import Recipe

EPS, ALPHA = 0.1, 0.05


def linear_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3)).eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([[0.2, 0.4, 0.6, 0.8], [0.9, 0.1, 0.5, 0.3], [0.5, 0.5, 0.5, 0.5]]).reshape(3, 1, 2, 2)
    return x, torch.tensor([0, 1, 2])


def ctx(gamma: float, warmup: int = 0, epoch: int = 1, **extra) -> StepContext:
    s = {"steps": 2, "mix": 0.0, "beta": 6.0, "awp_gamma": gamma, "awp_warmup": warmup, **extra}
    return StepContext(settings=s, eps=EPS, alpha=ALPHA, epoch_number=epoch)


def test_the_perturbation_is_gamma_times_the_weight_norm_along_the_loss_gradient_and_skips_biases():
    model, (x, y) = linear_model(), batch()
    w = model[1].weight
    (g,) = torch.autograd.grad(F.cross_entropy(model(x), y), w)
    v = awp.perturbation(model, lambda: F.cross_entropy(model(x), y), 0.01)
    assert list(v) == ["1.weight"]  # the bias (one dimension) is not perturbed
    want = 0.01 * w.detach().norm() * g / g.norm()
    assert torch.allclose(v["1.weight"], want, atol=1e-9)
    assert float(v["1.weight"].norm()) == pytest.approx(0.01 * float(w.detach().norm()), rel=1e-6)
    # it points up the loss: a small step along v raises it
    awp.shift(model, v)
    with torch.no_grad():
        up = float(F.cross_entropy(model(x), y))
    awp.shift(model, v, -1.0)
    with torch.no_grad():
        base = float(F.cross_entropy(model(x), y))
    assert up > base


def test_a_zero_gradient_gives_no_perturbation():
    model, (x, _) = linear_model(), batch()
    v = awp.perturbation(model, lambda: 0.0 * model(x).sum(), 0.5)
    assert torch.equal(v["1.weight"], torch.zeros(3, 4))


def test_shift_adds_and_takes_back_the_perturbation():
    model = linear_model()
    w0 = model[1].weight.detach().clone()
    v = {"1.weight": torch.full((3, 4), 0.25)}
    awp.shift(model, v)
    assert torch.equal(model[1].weight.detach(), w0 + 0.25)
    awp.shift(model, v, -1.0)
    assert torch.allclose(model[1].weight.detach(), w0, atol=1e-7)


@pytest.mark.parametrize(("gamma", "warmup", "epoch", "on"), [
    (0.0, 0, 5, False), (0.01, 0, 1, True), (0.01, 2, 2, False), (0.01, 2, 3, True), (0.01, 2, 0, True)])
def test_awp_is_active_with_a_positive_gamma_after_the_warm_up_epochs(gamma, warmup, epoch, on):
    assert awp.active(ctx(gamma, warmup, epoch)) is on


def test_the_perturbation_leaves_batch_norm_statistics_and_the_mode_alone():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3)).eval()
    x, y = batch()
    before = {k: b.clone() for k, b in model.named_buffers()}
    v = awp.perturbation(model, lambda: F.cross_entropy(model(x), y), 0.01)
    assert sorted(v) == ["0.weight", "3.weight"]  # conv and linear weights, not batch-norm's scale
    assert not model.training
    for k, b in model.named_buffers():
        assert torch.equal(b, before[k]), k


def adversarial(method, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The method's adversarial points for the test's settings (generator seed 3) at the model's weights."""
    g = torch.Generator().manual_seed(3)
    if method is trades:
        return trades.adversary(model, x, g, eps=EPS, alpha=ALPHA, steps=2)
    return inner.pgd(model, x, y, g, eps=EPS, alpha=ALPHA, steps=2)[0]


@pytest.mark.parametrize("method", [pgd_at, trades])
def test_the_step_loss_is_taken_at_the_perturbed_weights_and_restore_takes_them_back(method):
    model, (x, y) = linear_model(), batch()
    w0 = model[1].weight.detach().clone()
    adv = adversarial(method, model, x, y)  # the attack runs before the weights move
    plain = method.step(model, x, y, torch.Generator().manual_seed(3), ctx(0.0))
    assert plain.restore is None
    out = method.step(model, x, y, torch.Generator().manual_seed(3), ctx(0.1))
    shifted = model[1].weight.detach().clone()
    assert float((shifted - w0).norm()) == pytest.approx(0.1 * float(w0.norm()), rel=1e-5)
    with torch.no_grad():
        if method is trades:
            want = trades.loss(model, x, y, adv, 6.0)[0]
        else:
            want = F.cross_entropy(model(adv), y)
    assert float(out.loss.detach()) == pytest.approx(float(want), rel=1e-5)
    assert float(out.loss.detach()) > float(plain.loss.detach())  # the perturbation raised the loss
    # one more forward and backward of the update's images (pgd-at: B, trades: 2 B)
    assert out.compute.train_forward == 2 * plain.compute.train_forward
    assert out.compute.train_backward == 2 * plain.compute.train_backward
    assert out.compute.attack_forward == plain.compute.attack_forward
    out.restore()
    assert torch.allclose(model[1].weight.detach(), w0, atol=1e-7)


def test_pgd_at_with_clean_training_only_has_nothing_to_perturb():
    model, (x, y) = linear_model(), batch()
    out = pgd_at.step(model, x, y, torch.Generator().manual_seed(3), ctx(0.1, mix=1.0))
    assert out.restore is None


def test_harden_takes_the_perturbation_back_after_every_step():
    """With a vanishing learning rate the weights must end where they started: the perturbation (0.5 of each
    weight's norm per step) is taken back after each optimiser step, never accumulated."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    w0 = model[1].weight.detach().clone()
    x = torch.rand(24, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    y = torch.arange(24) % 3
    res = harden(model, (x, y), "pgd-at", eps=0.1, epochs=2, batch_size=8,
                 recipe=Recipe(lr=1e-12, optimizer="sgd", momentum=0.0, schedule=None), steps=2, awp_gamma=0.5)
    assert res.settings["awp_gamma"] == 0.5 and res.settings["awp_warmup"] == 0
    assert torch.allclose(model[1].weight.detach(), w0, atol=1e-6)


def test_the_awp_options_are_checked_and_belong_to_pgd_at_and_trades():
    assert harden_settings("trades", awp_gamma=0.005, awp_warmup=10)["awp_warmup"] == 10
    with pytest.raises(ConfigError, match="awp_gamma"):
        harden_settings("pgd-at", awp_gamma=-0.1)
    with pytest.raises(ConfigError, match="awp_warmup"):
        harden_settings("pgd-at", awp_warmup=-1)
    with pytest.raises(ConfigError, match="awp_gamma"):
        harden_settings("fast-at", awp_gamma=0.01)
