"""``n-fgsm``: de Jorge et al. (2022), "Make Some Noise: Reliable and Efficient Single-Step Adversarial Training".

One FGSM step of ``alpha`` (default ``eps``) from a uniform random start in ``[-noise * eps, noise * eps]`` (default
``noise = 2``), and no projection back into the eps-ball: the training perturbation may reach ``(noise + 1) eps``
in L-inf (only [0, 1] bounds it). The larger noise and the absence of clipping are what keep single-step training
from collapsing (the paper's Fig. 1: Fast-AT with its clipping collapses at eps 8/255 on CIFAR-10, N-FGSM does not).
The reference code (pdejorge/N-FGSM, ``--unif 2 --alpha eps --clip -1``) trains the model in train mode for the
attack too; here the attack runs in eval mode with frozen parameters, as in every robustest objective (batch
statistics are not updated by the attack's forward pass). ``2 N`` passes per epoch over N samples, as Fast-AT.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.modelcall import eval_mode, forward, frozen_params
from robustest.core.options import checked_option
from robustest.core.validation import check_float
from robustest.train.objectives.base import Objective, StepContext, StepOutput
from robustest.train.objectives.inner import adversarial_update

__all__ = ["OBJECTIVE", "perturb", "step"]


def perturb(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, *, eps: float, alpha: float,
            noise: float, clip: float | None = None, clamp_start: bool = True) -> torch.Tensor:
    """The N-FGSM point of every image of x (B x C x H x W in [0, 1]), y (int64 [B]): ``eta ~ U(-noise eps,
    noise eps)`` (drawn from ``gen``; ``x + eta`` kept in [0, 1] unless ``clamp_start`` is False), then
    ``x + eta + alpha * sign(grad CE at x + eta)`` in [0, 1]; with ``clip`` (a multiple of eps) the perturbation is
    also clamped to ``[-clip eps, clip eps]`` (None: not, the paper's default). One forward and one backward per
    image. Fast-AT's step is the case ``noise = clip = 1`` (fast_at.py: its MNIST code's unclamped start)."""
    eta = torch.rand(x.shape, generator=gen, device=x.device, dtype=x.dtype).mul_(2 * noise * eps).sub_(noise * eps)
    start = x + eta
    if clamp_start:
        start = start.clamp_(0.0, 1.0)
    start = start.requires_grad_(True)
    with torch.enable_grad():
        loss = F.cross_entropy(forward(model, start), y, reduction="sum")
        (grad,) = torch.autograd.grad(loss, start)
    adv = start.detach() + alpha * grad.sign()
    if clip is not None:
        adv = torch.minimum(torch.maximum(adv, x - clip * eps), x + clip * eps)
    return adv.clamp_(0.0, 1.0)


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, ctx: StepContext) -> StepOutput:
    """One N-FGSM step on the batch x (B x C x H x W), y (int64 [B]): the noisy unclipped FGSM point, then
    CE(x_adv) in train mode."""
    s = ctx.settings
    with eval_mode(model), frozen_params(model):
        adv = perturb(model, x, y, gen, eps=ctx.eps, alpha=ctx.alpha, noise=s["noise"], clip=s["clip"]).detach()
    evals = torch.ones(x.shape[0], dtype=torch.long, device=x.device)
    return adversarial_update(model, x, y, adv, evals)


OBJECTIVE = Objective(
    name="n-fgsm", step=step, summary="de Jorge et al.: FGSM from a 2 eps noise start, unclipped (N-FGSM)",
    fixed_steps=1, alpha=lambda eps, steps: eps, alpha_doc="eps", co_guard=True,
    options=(checked_option("noise", 2.0, lambda v, n: check_float(n, v, lo=0.0, hi=10.0),
                            "half-width of the uniform start as a multiple of eps (the paper's k)"),
             checked_option("clip", None, lambda v, n: None if v is None else check_float(n, v, lo=0.0, lo_open=True),
                            "clamp the perturbation to clip * eps (default: none, as the paper)")),
)
