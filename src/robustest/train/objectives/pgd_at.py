"""``pgd-at``: Madry et al. (2018). k-step L-inf PGD with a uniform random start, step ``alpha``; the loss is
``mix * CE(x) + (1 - mix) * CE(x_adv)`` (``mix = 0``: pure adversarial training; ``mix = 1``: clean training, no
attack). Compute per epoch over N samples: ``N * (k + 1)`` passes (``N * (k + 2)`` with ``0 < mix < 1``, ``N``
with ``mix = 1``). With ``awp_gamma`` > 0 the update is taken at adversarially perturbed weights (:mod:`.awp`: the
gradient of the same loss; one more forward and backward of the update's images)."""

from __future__ import annotations

import torch
from torch import nn

from robustest.core.modelcall import eval_mode, frozen_params
from robustest.core.options import checked_option
from robustest.core.validation import check_float
from robustest.train.objectives import awp
from robustest.train.objectives.base import Objective, StepContext, StepOutput
from robustest.train.objectives.inner import adversarial_update, cross_entropy_update, pgd

__all__ = ["OBJECTIVE", "step"]


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, ctx: StepContext) -> StepOutput:
    """One PGD-AT step on the batch x (B x C x H x W), y (int64 [B])."""
    s = ctx.settings
    evals = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    adv = None
    with eval_mode(model), frozen_params(model):
        if s["mix"] < 1.0:
            adv, evals = pgd(model, x, y, gen, eps=ctx.eps, alpha=ctx.alpha, steps=s["steps"])
            adv = adv.detach()
    v = None
    if adv is not None:
        v = awp.perturb(model, lambda: cross_entropy_update(model, x, y, adv, s["mix"])[0], ctx)
    out = adversarial_update(model, x, y, adv, evals, s["mix"])
    return awp.attach(out, model, v, out.compute.train_forward)


OBJECTIVE = Objective(
    name="pgd-at", step=step, summary="Madry et al.: PGD adversarial training",
    options=(checked_option("mix", 0.0, lambda v, n: check_float(n, v, lo=0.0, hi=1.0),
                            "fraction of the loss on clean images, in [0, 1]"), *awp.OPTIONS),
)
