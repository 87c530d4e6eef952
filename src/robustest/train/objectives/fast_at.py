"""``fast-at``: Wong et al. (2020), one FGSM step of ``alpha = 1.25 eps`` from a uniform random start; ``2 N``
passes per epoch. Prone to catastrophic overfitting, so the guard (``co_guard``) is on by default: with
validation data, training stops when a guard rule fires in an epoch at the full radius and the best epoch is kept.

Where the FGSM gradient is taken: the authors' two codes differ. Their CIFAR-10 code clamps the random start
``x + delta`` into [0, 1] first (``clamp_start``, the default); their MNIST code (locuslab/fast_adversarial,
``MNIST/train_mnist.py``) takes the gradient at the unclamped ``x + delta``, outside the image range where a pixel
is saturated, and clamps only the final point. On MNIST, whose pixels are mostly 0 or 1, it matters: from scratch
at eps 0.3 with their cyclic rate, 69.5 % AutoAttack against the clamped start's 19.3 % (one seed); trained at 0.4
(harden's ``eps_train``), 82.8 ± 1.0 % against 74.3 ± 7.6 % over three seeds (docs/RESULTS.md). The final point
is formed the same way: ``x + clamp(delta + alpha sign(g), -eps, eps)``, clamped into [0, 1]. The unclamped step
is N-FGSM's (:func:`robustest.train.objectives.n_fgsm.perturb`) with noise 1, clip 1 and its start unclamped."""

from __future__ import annotations

import torch
from torch import nn

from robustest.core.modelcall import eval_mode, frozen_params
from robustest.core.options import checked_option
from robustest.core.validation import check_bool
from robustest.train.objectives.base import Objective, StepContext, StepOutput
from robustest.train.objectives.inner import adversarial_update, pgd
from robustest.train.objectives.n_fgsm import perturb

__all__ = ["OBJECTIVE", "step"]


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, ctx: StepContext) -> StepOutput:
    """One Fast-AT step on the batch x (B x C x H x W), y (int64 [B]): the one-step attack, then CE(x_adv)."""
    with eval_mode(model), frozen_params(model):
        if ctx.settings["clamp_start"]:
            adv, evals = pgd(model, x, y, gen, eps=ctx.eps, alpha=ctx.alpha, steps=ctx.settings["steps"])
        else:
            adv = perturb(model, x, y, gen, eps=ctx.eps, alpha=ctx.alpha, noise=1.0, clip=1.0, clamp_start=False)
            evals = torch.ones(x.shape[0], dtype=torch.long, device=x.device)
        adv = adv.detach()
    return adversarial_update(model, x, y, adv, evals)


OBJECTIVE = Objective(
    name="fast-at", step=step, summary="Wong et al.: FGSM from a random start (Fast-AT)", fixed_steps=1,
    alpha=lambda eps, steps: 1.25 * eps, alpha_doc="1.25 * eps", co_guard=True,
    options=(checked_option("clamp_start", True, lambda v, n: check_bool(n, v),
                            "take the FGSM gradient at the unclamped random start, outside [0, 1] where a pixel is "
                            "saturated (the authors' MNIST code; steadier on MNIST from scratch: docs/HARDEN.md); "
                            "default: at the start clamped into [0, 1], their CIFAR-10 code", "switch"),),
)
