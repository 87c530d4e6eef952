"""``trades``: Zhang et al. (2019). The loss is ``CE(f(x), y) + beta * KL(p(x) || p(x_adv))``, the inner
maximisation of the KL by k sign-gradient steps from ``x + 0.001 * N(0, I)`` (their PGD-KL); ``N * (k + 2 + 1/3)``
passes per epoch over N samples. ``beta`` defaults to 3, not the paper's 6: on MNIST at eps 0.3 from scratch
beta 6 ends below 95 % clean accuracy and beta 3 is as robust (docs/RESULTS.md, "Which TRADES beta"). With
``awp_gamma`` > 0 the update is taken at adversarially perturbed weights (:mod:`.awp`: the gradient of the same
loss; two more forwards and backwards per image)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from robustest.attacks import project
from robustest.core.compute import ComputeCount
from robustest.core.modelcall import eval_mode, forward, frozen_params
from robustest.core.options import checked_option
from robustest.core.validation import check_float
from robustest.train.objectives import awp
from robustest.train.objectives.base import Objective, StepContext, StepOutput

__all__ = ["OBJECTIVE", "adversary", "loss", "step"]


def adversary(model: nn.Module, x: torch.Tensor, gen: torch.Generator, *, eps: float, alpha: float,
              steps: int) -> torch.Tensor:
    """TRADES' inner maximisation: sign-gradient ascent on KL(p(x) || p(x')) from x + 0.001 * N(0, I)
    (x: B x C x H x W; returns x' of the same shape, in the L-inf ball and [0, 1])."""
    with torch.no_grad():
        p_nat = F.softmax(forward(model, x), dim=1)
    lo, hi = (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)
    adv = (x + 0.001 * torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype)).clamp_(lo, hi)
    for _ in range(steps):
        adv = adv.detach().requires_grad_(True)
        with torch.enable_grad():
            kl = F.kl_div(F.log_softmax(forward(model, adv), dim=1), p_nat, reduction="sum")
            (g,) = torch.autograd.grad(kl, adv)
        adv = project(adv.detach() + alpha * g.sign(), x, eps, "linf", lo, hi)
    return adv.detach()


def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, adv: torch.Tensor, beta: float
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """TRADES' loss ``CE(f(x), y) + beta * KL(p(x) || p(x_adv))`` (the KL summed over the batch and divided by B)
    in the model's current mode, and the logits at ``adv`` (B x K)."""
    logits_nat = forward(model, x)
    logits_adv = forward(model, adv)
    kl = F.kl_div(F.log_softmax(logits_adv, dim=1), F.softmax(logits_nat, dim=1), reduction="sum") / x.shape[0]
    return F.cross_entropy(logits_nat, y) + beta * kl, logits_adv


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, ctx: StepContext) -> StepOutput:
    """One TRADES step on the batch x (B x C x H x W), y (int64 [B])."""
    s, b = ctx.settings, x.shape[0]
    with eval_mode(model), frozen_params(model):
        adv = adversary(model, x, gen, eps=ctx.eps, alpha=ctx.alpha, steps=s["steps"])
    evals = torch.full((b,), s["steps"], dtype=torch.long, device=x.device)
    n_evals = b * s["steps"]
    count = ComputeCount(attack_forward=b + n_evals, attack_backward=n_evals)  # + the forward of p(x)
    v = awp.perturb(model, lambda: loss(model, x, y, adv, s["beta"])[0], ctx)
    model.train()
    value, logits_adv = loss(model, x, y, adv, s["beta"])
    count.train_forward = count.train_backward = 2 * b
    return awp.attach(StepOutput(value, logits_adv, evals, count), model, v, 2 * b)


OBJECTIVE = Objective(
    name="trades", step=step, summary="Zhang et al.: TRADES (CE + beta * KL to the adversarial point)",
    options=(checked_option("beta", 3.0, lambda v, n: check_float(n, v, lo=0.0),
                            "weight of the KL term (Zhang et al.: 6; 3 keeps MNIST clean accuracy >= 95 %)"),
             *awp.OPTIONS),
    diverged_hint=" or beta",
)
