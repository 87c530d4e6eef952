"""``fast-at``: Wong et al. (2020), one FGSM step of ``alpha = 1.25 eps`` from a uniform random start; ``2 N``
passes per epoch. Prone to catastrophic overfitting, so the guard (``co_guard``) is on by default: with
validation data, training stops when the validation PGD accuracy collapses and the best epoch is kept."""

from __future__ import annotations

import torch
from torch import nn

from robustest.core.modelcall import eval_mode, frozen_params
from robustest.train.objectives.base import Objective, StepContext, StepOutput
from robustest.train.objectives.inner import adversarial_update, pgd

__all__ = ["OBJECTIVE", "step"]


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, ctx: StepContext) -> StepOutput:
    """One Fast-AT step on the batch x (B x C x H x W), y (int64 [B]): the one-step attack, then CE(x_adv)."""
    with eval_mode(model), frozen_params(model):
        adv, evals = pgd(model, x, y, gen, eps=ctx.eps, alpha=ctx.alpha, steps=ctx.settings["steps"])
        adv = adv.detach()
    return adversarial_update(model, x, y, adv, evals)


OBJECTIVE = Objective(
    name="fast-at", step=step, summary="Wong et al.: FGSM from a random start (Fast-AT)", fixed_steps=1,
    alpha=lambda eps, steps: 1.25 * eps, alpha_doc="1.25 * eps", co_guard=True,
)
