"""Exact behaviour of the hardening objectives' losses and stopping rules on a tiny linear model whose values
can be recomputed by hand: TRADES' loss (the KL's direction and beta), the FOL / FOSC criterion (<= stops), the
first gradient evaluation at which fosc and fol-budget may stop a sample."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from robustest.train.objectives import StepContext, fol_budget, fosc, inner, trades

EPS, ALPHA = 0.1, 0.05


def linear_model(zero: bool = False) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    if zero:
        nn.init.zeros_(m[1].weight)
    return m.eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([[0.2, 0.4, 0.6, 0.8], [0.9, 0.1, 0.5, 0.3], [0.5, 0.5, 0.5, 0.5]]).reshape(3, 1, 2, 2)
    return x, torch.tensor([0, 1, 2])


def gen() -> torch.Generator:
    return torch.Generator().manual_seed(7)


def test_fol_is_eps_times_the_gradient_l1_norm_minus_delta_dot_gradient():
    g = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    delta = torch.tensor([[0.1, -0.1], [-0.2, 0.3]])
    # sample 0: 0.1 * 3 - (0.1 - (-0.1) * -2 ... ) = 0.3 - (0.1 + 0.2) = 0.0; sample 1: 0.1 * 0.5 - (-0.1) = 0.15
    assert torch.allclose(inner.fol(g, delta, 0.1), torch.tensor([0.0, 0.15]), atol=1e-7)


@pytest.mark.parametrize("beta", [0.0, 1.0, 6.0])
def test_trades_loss_is_ce_plus_beta_times_kl_from_the_clean_to_the_adversarial_prediction(beta):
    model, (x, y) = linear_model(), batch()
    ctx = StepContext(settings={"steps": 3, "beta": beta}, eps=EPS, alpha=ALPHA)
    out = trades.step(model, x, y, gen(), ctx)
    adv = trades.adversary(model, x, gen(), eps=EPS, alpha=ALPHA, steps=3)
    assert torch.equal(out.logits, model(adv))
    with torch.no_grad():
        p, q = F.softmax(model(x), 1), F.softmax(model(adv), 1)
        kl = (p * (p.log() - q.log())).sum(1).mean()  # KL(p(x) || p(x_adv)), averaged over the batch
        want = F.cross_entropy(model(x), y) + beta * kl
    assert float(kl) > 1e-4  # the adversarial point moved the prediction: the KL term counts
    assert float(out.loss.detach()) == pytest.approx(float(want), rel=1e-5)
    assert out.evals.tolist() == [3, 3, 3] and out.compute.attack_backward == 9


def test_the_trades_adversary_moves_within_the_ball_and_raises_the_kl():
    model, (x, _) = linear_model(), batch()
    adv = trades.adversary(model, x, gen(), eps=EPS, alpha=ALPHA, steps=3)
    assert float((adv - x).abs().max()) <= EPS + 1e-7 and float((adv - x).abs().max()) > 0.5 * EPS
    with torch.no_grad():
        p = F.softmax(model(x), 1)
        start = (x + 0.001 * torch.randn(x.shape, generator=gen())).clamp(0, 1)
        kl = [F.kl_div(F.log_softmax(model(z), 1), p, reduction="sum") for z in (start, adv)]
    assert kl[1] > kl[0]


def test_fol_at_the_threshold_stops_the_sample():
    # a model with zero weights has a zero gradient: FOL = 0 <= 0 stops every sample at its first check
    model, (x, y) = linear_model(zero=True), batch()
    _, evals = inner.pgd(model, x, y, gen(), eps=EPS, alpha=ALPHA, steps=5, threshold=0.0, first_check=0)
    assert evals.tolist() == [1, 1, 1]
    _, evals = inner.pgd(model, x, y, gen(), eps=EPS, alpha=ALPHA, steps=5, threshold=-1e-9, first_check=0)
    assert evals.tolist() == [5, 5, 5]


def test_fosc_takes_its_first_step_before_checking():
    model, (x, y) = linear_model(), batch()
    ctx = StepContext(settings={"steps": 5}, eps=EPS, alpha=ALPHA, epoch={"fosc_c": 1e9})
    out = fosc.step(model, x, y, gen(), ctx)
    # the criterion holds everywhere: every sample stops at the second gradient evaluation, after one step
    assert out.evals.tolist() == [2, 2, 2] and out.stopped == 3
    one_step, _ = inner.pgd(model, x, y, gen(), eps=EPS, alpha=ALPHA, steps=1)
    assert torch.equal(out.logits, model(one_step))


@pytest.mark.parametrize("min_steps", [0, 1, 2, 4])
def test_fol_budget_checks_from_evaluation_fol_min_steps(min_steps):
    model, (x, y) = linear_model(), batch()
    s = {"steps": 5, "fol_threshold": 1e9, "fol_min_steps": min_steps, "stop_misclassified": False}
    out = fol_budget.step(model, x, y, gen(), StepContext(settings=s, eps=EPS, alpha=ALPHA))
    assert out.evals.tolist() == [min_steps + 1] * 3
    # a sample stopped at the budget's last evaluation did not stop early
    assert out.stopped == (3 if min_steps + 1 < 5 else 0) and out.compute.attack_forward == 3 * (min_steps + 1)


def test_fol_budget_stops_misclassified_samples_only_when_asked():
    model, (x, y) = linear_model(), batch()
    wrong = model(x).argmax(1) != y
    s = {"steps": 4, "fol_threshold": -1.0, "fol_min_steps": 0, "stop_misclassified": True}
    out = fol_budget.step(model, x, y, gen(), StepContext(settings=s, eps=EPS, alpha=ALPHA))
    assert bool(wrong.any())
    assert all(e == 1 for e, w in zip(out.evals.tolist(), wrong.tolist()) if w)
    off = fol_budget.step(model, x, y, gen(), StepContext(settings={**s, "stop_misclassified": False},
                                                          eps=EPS, alpha=ALPHA))
    assert off.evals.tolist() == [4, 4, 4] and off.stopped == 0


def test_fol_budget_needs_fol_min_steps_below_steps():
    from robustest.core.errors import ConfigError

    fol_budget.check({"steps": 5, "fol_min_steps": 4})
    with pytest.raises(ConfigError, match=r"fol_min_steps \(5\) must be below steps \(5\)"):
        fol_budget.check({"steps": 5, "fol_min_steps": 5})


def test_the_trades_adversary_starts_at_x_plus_a_thousandth_of_gaussian_noise():
    """With no step, the start itself: x + 0.001 * N(0, I) from the generator, kept in the ball and [0, 1]."""
    model, (x, _) = linear_model(), batch()
    start = trades.adversary(model, x, gen(), eps=EPS, alpha=ALPHA, steps=0)
    noise = torch.randn(x.shape, generator=gen())
    assert torch.equal(start, (x + 0.001 * noise).clamp((x - EPS).clamp(min=0), (x + EPS).clamp(max=1)))
    assert not torch.equal(start, (x - 0.001 * noise).clamp(0, 1))
    x64 = x.double()  # the noise is drawn in the images' dtype (a float32 draw differs from a float64 one)
    start64 = trades.adversary(model.double(), x64, gen(), eps=EPS, alpha=ALPHA, steps=0)
    noise64 = torch.randn(x.shape, generator=gen(), dtype=torch.float64)
    assert start64.dtype == torch.float64
    assert torch.equal(start64, (x64 + 0.001 * noise64).clamp((x64 - EPS).clamp(min=0), (x64 + EPS).clamp(max=1)))


def test_an_update_without_attack_counts_no_attack_evaluations_as_integers():
    """pgd-at with mix 1 trains on clean images only: zero gradient evaluations (int64, as every objective's)."""
    from robustest.train import harden_settings
    from robustest.train.objectives import pgd_at

    model, (x, y) = linear_model(), batch()
    s = {**harden_settings("pgd-at", eps=EPS), "mix": 1.0}
    out = pgd_at.step(model, x, y, gen(), StepContext(settings=s, eps=EPS, alpha=ALPHA))
    assert out.evals.dtype == torch.int64 and out.evals.tolist() == [0] * len(y)
    assert (out.compute.attack_forward, out.compute.train_forward, out.compute.train_backward) == (0, len(y), len(y))
    assert torch.allclose(out.loss, F.cross_entropy(model(x), y))
