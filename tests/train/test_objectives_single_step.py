"""The single-step objectives that resist catastrophic overfitting, checked by hand: Fast-AT's unclamped start
(Wong et al.'s MNIST code), N-FGSM (de Jorge et al. 2022: a 2 eps noise start, one step of eps, no clipping) and
GradAlign (Andriushchenko & Flammarion 2020: FGSM plus lambda (1 - cos) of the input gradients at x and at a random
point of its ball), and the guard's rule for a collapse that never rose."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.errors import ConfigError
from robustest.train import early_stopping, harden_settings, objectives
from robustest.train.objectives import StepContext, fast_at, grad_align, n_fgsm
from robustest.train.objectives.inner import pgd


def linear(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 3))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.rand(6, 2, 2, 2, generator=g), torch.tensor([0, 1, 2, 0, 1, 2])


def relu_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def saturated_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose pixels are mostly 0 or 1, as MNIST's are."""
    x, y = batch()
    return (x > 0.5).float(), y


def unclamped(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, alpha: float) -> torch.Tensor:
    """fast-at's step without clamping its start: N-FGSM's with noise 1, clip 1, drawn from seed 5."""
    return n_fgsm.perturb(model, x, y, torch.Generator().manual_seed(5), eps=eps, alpha=alpha, noise=1.0, clip=1.0,
                          clamp_start=False)


def test_fast_at_unclamped_start_takes_the_gradient_outside_the_image_range():
    model, (x, y), eps = relu_net().eval(), saturated_batch(), 0.3
    adv = unclamped(model, x, y, eps, 1.25 * eps)
    delta = torch.rand(x.shape, generator=torch.Generator().manual_seed(5)).mul_(2 * eps).sub_(eps)
    start = (x + delta).requires_grad_(True)
    assert float(start.detach().min()) < 0.0 < 1.0 < float(start.detach().max())  # the gradient: outside [0, 1]
    (g,) = torch.autograd.grad(F.cross_entropy(model(start), y, reduction="sum"), start)
    expected = torch.min(torch.max(start.detach() + 1.25 * eps * g.sign(), x - eps), x + eps).clamp(0, 1)
    assert torch.equal(adv, expected)  # x + clamp(delta + alpha sign(g), -eps, eps), in [0, 1]
    assert float(adv.min()) >= 0.0 and float(adv.max()) <= 1.0 and float((adv - x).abs().max()) <= eps + 1e-6
    # the clamped start (the CIFAR-10 code): the same noise, the gradient at the start clamped into [0, 1]
    inside = start.detach().clamp(0, 1).requires_grad_(True)
    (gc,) = torch.autograd.grad(F.cross_entropy(model(inside), y, reduction="sum"), inside)
    clamped = torch.min(torch.max(start.detach() + 1.25 * eps * gc.sign(), x - eps), x + eps).clamp(0, 1)
    assert not torch.equal(adv, clamped)
    still = unclamped(model, x, y, eps, 0.0)
    assert torch.equal(still, (x + delta).clamp(0, 1))  # no step: the start, clamped only at the end

    blind = relu_net()  # a model that does not see pixels 0 and 1: its gradient there is exactly 0, so no step
    with torch.no_grad():
        blind[1].weight[:, :2] = 0.0
    adv = unclamped(blind, x, y, eps, 1.25 * eps)
    flat, start_flat = adv.flatten(1), (x + delta).clamp(0, 1).flatten(1)
    assert torch.equal(flat[:, :2], start_flat[:, :2]) and not torch.equal(flat[:, 2:], start_flat[:, 2:])


def test_fast_at_unclamped_start_draws_in_the_images_dtype():
    model, (x, y), eps = relu_net().double().eval(), saturated_batch(), 0.3
    x = x.double()
    adv = unclamped(model, x, y, eps, 0.0)
    delta = torch.rand(x.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * (2 * eps) - eps
    assert adv.dtype == torch.float64 and torch.allclose(adv, (x + delta).clamp(0, 1), atol=1e-15, rtol=0)


@pytest.mark.parametrize("clamp_start", [True, False])
def test_fast_at_step_trains_on_its_start_at_two_passes_per_image(clamp_start):
    model, (x, y) = relu_net(), batch()  # pixels inside [0, 1]: the step's size shows (at 0 or 1 it is clipped away)
    s = harden_settings("fast-at", eps=0.3, clamp_start=clamp_start)
    assert (s["alpha"], s["steps"], s["clamp_start"], s["co_guard"]) == (pytest.approx(0.375), 1, clamp_start, True)
    out = fast_at.step(model, x, y, torch.Generator().manual_seed(5), StepContext(settings=s, eps=0.3, alpha=0.375))
    model.eval()
    gen = torch.Generator().manual_seed(5)
    if clamp_start:
        adv, _ = pgd(model, x, y, gen, eps=0.3, alpha=0.375, steps=1)
    else:
        adv = n_fgsm.perturb(model, x, y, gen, eps=0.3, alpha=0.375, noise=1.0, clip=1.0, clamp_start=False)
    assert torch.allclose(out.loss, F.cross_entropy(model(adv), y))
    assert out.evals.dtype == torch.int64 and out.evals.tolist() == [1] * 6
    assert (out.compute.attack_forward, out.compute.attack_backward, out.compute.train_forward,
            out.compute.train_backward) == (6, 6, 6, 6)


def test_fast_at_clamps_its_start_by_default_and_refuses_a_non_boolean():
    assert harden_settings("fast-at", eps=0.3)["clamp_start"] is True
    with pytest.raises(ConfigError, match="clamp_start must be true or false, got 'no'"):
        harden_settings("fast-at", eps=0.3, clamp_start="no")


def test_n_fgsm_is_one_unclipped_step_of_alpha_from_a_noise_start():
    model, (x, y), eps = linear().eval(), batch(), 0.1
    adv = n_fgsm.perturb(model, x, y, torch.Generator().manual_seed(5), eps=eps, alpha=eps, noise=2.0)
    eta = torch.rand(x.shape, generator=torch.Generator().manual_seed(5)).mul_(4 * eps).sub_(2 * eps)
    start = (x + eta).clamp(0, 1).requires_grad_(True)
    (g,) = torch.autograd.grad(F.cross_entropy(model(start), y, reduction="sum"), start)
    assert torch.allclose(adv, (start.detach() + eps * g.sign()).clamp(0, 1))
    inner = (x > 0.35) & (x < 0.65)  # far from [0, 1]'s ends: nothing clamps the perturbation there
    assert float((adv - x).abs()[inner].max()) > eps  # not projected back into the ball: up to 3 eps
    assert float((adv - x).abs().max()) <= 3 * eps + 1e-6
    clipped = n_fgsm.perturb(model, x, y, torch.Generator().manual_seed(5), eps=eps, alpha=eps, noise=2.0, clip=1.0)
    assert float((clipped - x).abs().max()) <= eps + 1e-6
    still = n_fgsm.perturb(model, x, y, torch.Generator().manual_seed(5), eps=eps, alpha=0.0, noise=0.0)
    assert torch.equal(still, x)  # no noise, no step: the clean images


def test_n_fgsm_step_trains_on_the_perturbed_batch_at_two_passes_per_image():
    model, (x, y) = linear(), batch()
    s = harden_settings("n-fgsm", eps=0.1)
    assert (s["alpha"], s["noise"], s["clip"], s["steps"], s["co_guard"]) == (0.1, 2.0, None, 1, True)
    out = n_fgsm.step(model, x, y, torch.Generator().manual_seed(5), StepContext(settings=s, eps=0.1, alpha=0.1))
    model.eval()
    adv = n_fgsm.perturb(model, x, y, torch.Generator().manual_seed(5), eps=0.1, alpha=0.1, noise=2.0)
    assert torch.allclose(out.loss, F.cross_entropy(model(adv), y)) and model.training is False
    assert out.evals.dtype == torch.int64 and out.evals.tolist() == [1] * 6
    assert out.compute.passes == 6 + 6  # (6 + 2*6) / 3 attack + the same update
    assert (out.compute.attack_forward, out.compute.attack_backward, out.compute.train_forward,
            out.compute.train_backward) == (6, 6, 6, 6)


def test_alignment_is_the_mean_cosine_over_samples_with_both_gradients():
    g1 = torch.tensor([[1.0, 0.0], [0.0, 0.0], [2.0, 2.0]])
    g2 = torch.tensor([[1.0, 1.0], [3.0, 1.0], [-1.0, -1.0]])
    assert grad_align.alignment(g1, g2).item() == pytest.approx((1 / math.sqrt(2) - 1) / 2)  # sample 1 left out
    assert grad_align.alignment(torch.zeros(2, 3), torch.ones(2, 3)).item() == 1.0


def test_alignment_stays_finite_for_vanishing_gradients():
    """Regression: a confidently classified sample's input gradients (norms ~1e-21) made the cosine's gradient
    overflow (1 / norm**2 in float32: NaN weight gradients), and GradAlign on Madry's MNIST CNN stopped with a NaN
    loss after 7 epochs. The norms are clamped at 1e-8 each, as torch's cosine_similarity (the reference's) does."""
    g = torch.tensor([[3e-22, 4e-22], [1.0, 0.0]], requires_grad=True)
    h = torch.tensor([[4e-22, 3e-22], [1.0, 0.0]], requires_grad=True)
    cos = grad_align.alignment(g, h)
    assert cos.item() == pytest.approx(0.5)  # the tiny pair (dot 2.4e-43 over 1e-16) counts as orthogonal
    cos.backward()
    assert bool(torch.isfinite(g.grad).all()) and bool(torch.isfinite(h.grad).all())
    small = torch.tensor([[3e-9, 4e-9]])
    assert grad_align.alignment(small, small).item() == pytest.approx(0.25)  # 25e-18 / (1e-8 * 1e-8)


@pytest.mark.parametrize("lam", [0.0, 0.2, 2.0])
def test_grad_align_loss_is_ce_of_fgsm_plus_lambda_one_minus_cosine(lam):
    model, (x, y), eps = linear(), batch(), 0.1
    s = {**harden_settings("grad-align", eps=eps), "grad_align_lambda": lam}
    out = grad_align.step(model, x, y, torch.Generator().manual_seed(9), StepContext(settings=s, eps=eps, alpha=eps))
    xr = x.clone().requires_grad_(True)
    (g1,) = torch.autograd.grad(F.cross_entropy(model(xr), y, reduction="sum"), xr)
    adv = torch.minimum(torch.maximum(x + eps * g1.sign(), x - eps), x + eps).clamp(0, 1)
    eta = torch.rand(x.shape, generator=torch.Generator().manual_seed(9)).mul_(2 * eps).sub_(eps)
    xe = (x + eta).clamp(0, 1).requires_grad_(True)
    (g2,) = torch.autograd.grad(F.cross_entropy(model(xe), y, reduction="sum"), xe)
    cos = F.cosine_similarity(g1.flatten(1), g2.flatten(1), dim=1).mean()
    expected = F.cross_entropy(model(adv), y) + lam * (1 - cos)
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert out.terms["grad_align"].item() == pytest.approx(lam * (1 - cos.item()), abs=1e-6)
    assert (out.compute.attack_forward, out.compute.attack_backward, out.compute.train_forward,
            out.compute.train_backward) == (6, 6, 12, 24)
    assert out.evals.dtype == torch.int64 and out.evals.tolist() == [1] * 6


def test_the_regulariser_trains_the_weights():
    model, (x, y) = linear(), batch()
    grads = []
    for lam in (0.0, 5.0):
        model.zero_grad()
        s = {**harden_settings("grad-align", eps=0.1), "grad_align_lambda": lam}
        grad_align.step(model, x, y, torch.Generator().manual_seed(9),
                        StepContext(settings=s, eps=0.1, alpha=0.1)).loss.backward()
        grads.append(model[1].weight.grad.clone())
    assert not torch.allclose(grads[0], grads[1])  # double backpropagation: the cosine reaches the weights


def test_both_are_harden_methods_with_checked_options():
    from robustest.core.errors import ConfigError

    assert {"n-fgsm", "grad-align"} <= set(objectives.names())
    with pytest.raises(ConfigError, match=r"^noise must be a number in \[0, 10\], got -1$"):
        harden_settings("n-fgsm", eps=0.1, noise=-1)
    with pytest.raises(ConfigError, match=r"^clip must be a number > 0, got 0$"):
        harden_settings("n-fgsm", eps=0.1, clip=0)
    with pytest.raises(ConfigError, match=r"^grad_align_lambda must be a number in \[0, 1000\], got -0.5$"):
        harden_settings("grad-align", eps=0.1, grad_align_lambda=-0.5)
    assert harden_settings("grad-align", eps=0.3)["grad_align_lambda"] == 0.2


@pytest.mark.parametrize("train_adv, val_pgd, fires", [(0.9, 0.05, True), (0.9, 0.4, True), (0.9, 0.41, False),
                                                       (0.6, 0.55, False), (0.2, 0.9, False)])
def test_a_collapse_that_never_rose_is_a_training_accuracy_far_above_validation(train_adv, val_pgd, fires):
    assert early_stopping.CO_GAP == 0.5
    assert early_stopping.masked(train_adv, val_pgd) is fires


def test_alignment_leaves_out_a_sample_whose_second_gradient_is_zero():
    g1 = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    g2 = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    assert grad_align.alignment(g1, g2).item() == pytest.approx(1.0)  # only the second sample counts


