"""``grad-align``: Andriushchenko & Flammarion (2020), "Understanding and Improving Fast Adversarial Training".

FGSM from the clean image (step ``alpha``, default ``eps``, projected into the eps-ball and [0, 1]) plus the
GradAlign regulariser ``lambda * (1 - mean cos(grad_x CE(x, y), grad_x CE(x + eta, y)))``, ``eta ~ U(-eps, eps)``:
the input gradients at the image and at a random point of its ball are kept aligned, which is what a model loses
when single-step training collapses (catastrophic overfitting). The cosine is taken per sample over the samples
whose two gradients are both non-zero, and both gradients keep their graphs (double backpropagation), so the
regulariser trains the weights. ``lambda`` defaults to 0.2, the reference value at eps 8/255 on CIFAR-10
(tml-epfl/understanding-fast-adv-training: ``--attack fgsm --attack_init zero --grad_align_cos_lambda 0.2``; the
authors scale it log-linearly with eps and give no MNIST value): larger radii need a larger one (at MNIST eps 0.3
from scratch, 0.2 gives 14 % AutoAttack and 2 gives 54 %: docs/RESULTS.md).

Compute per batch of B: the FGSM gradient at x (counted as the attack: B forwards, B backwards, its graph kept);
the update: the gradient at the random point (B forwards, B backwards), the forward at x_adv (B) and one backward
that runs back through x_adv's loss and through both gradient graphs (counted as 3 B sample-backwards): 2 B
forwards and 4 B backwards, a lower bound (a backward through a backward costs about one more forward and backward
in practice). About 3 times Fast-AT's cost.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.compute import ComputeCount
from robustest.core.modelcall import forward
from robustest.core.options import checked_option
from robustest.core.validation import check_float
from robustest.train.objectives.base import Objective, StepContext, StepOutput

__all__ = ["OBJECTIVE", "alignment", "step"]


def _input_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """grad_x of the summed CE at x (B x C x H x W), its graph kept (double backpropagation)."""
    xr = x.detach().requires_grad_(True)
    loss = F.cross_entropy(forward(model, xr), y, reduction="sum")
    (g,) = torch.autograd.grad(loss, xr, create_graph=True)
    return g


#: the smallest gradient norm the cosine divides by (torch's ``cosine_similarity`` default, the reference code's)
COS_EPS = 1e-8


def alignment(g1: torch.Tensor, g2: torch.Tensor) -> torch.Tensor:
    """Mean cosine similarity of the per-sample gradients g1, g2 (B x ...) over the samples where both are non-zero
    (a scalar keeping the graphs; 1 when there is none: nothing to align). Each norm is clamped to at least
    :data:`COS_EPS` (``torch.nn.functional.cosine_similarity``, as the reference code computes it): the gradients of
    a confidently classified sample can be so small that the product of their norms underflows to 0 in float32
    (a NaN loss) and the cosine's gradient overflows."""
    a, b = g1.flatten(1), g2.flatten(1)
    keep = (a.norm(dim=1) > 0) & (b.norm(dim=1) > 0)
    if not bool(keep.any()):
        return torch.ones((), device=g1.device, dtype=g1.dtype)
    return F.cosine_similarity(a[keep], b[keep], dim=1, eps=COS_EPS).mean()


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, ctx: StepContext) -> StepOutput:
    """One GradAlign step on the batch x (B x C x H x W), y (int64 [B]), the model in train mode throughout (the
    regulariser's gradients must reach the weights)."""
    b, eps = x.shape[0], ctx.eps
    model.train()
    g_clean = _input_gradient(model, x, y)
    adv = (x + ctx.alpha * g_clean.detach().sign())
    adv = torch.minimum(torch.maximum(adv, x - eps), x + eps).clamp_(0.0, 1.0).detach()
    eta = torch.rand(x.shape, generator=gen, device=x.device, dtype=x.dtype).mul_(2 * eps).sub_(eps)
    g_random = _input_gradient(model, (x + eta).clamp_(0.0, 1.0), y)
    logits = forward(model, adv)
    reg = ctx.settings["grad_align_lambda"] * (1.0 - alignment(g_clean, g_random))
    loss = F.cross_entropy(logits, y) + reg
    evals = torch.ones(b, dtype=torch.long, device=x.device)
    count = ComputeCount(attack_forward=b, attack_backward=b, train_forward=2 * b, train_backward=4 * b)
    return StepOutput(loss, logits, evals, count, terms={"grad_align": reg.detach()})


OBJECTIVE = Objective(
    name="grad-align", step=step, summary="Andriushchenko & Flammarion: FGSM + the GradAlign regulariser",
    fixed_steps=1, alpha=lambda eps, steps: eps, alpha_doc="eps", co_guard=True,
    options=(checked_option("grad_align_lambda", 0.2, lambda v, n: check_float(n, v, lo=0.0, hi=1000.0),
                            "weight of the gradient-alignment term (the reference's 0.2 at eps 8/255; MNIST eps "
                            "0.3: 2)"),),
)
