"""``gaussian-noise``: Cohen, Rosenfeld & Kolter (2019)'s training for randomised smoothing: the cross-entropy of the
model (in train mode) on ``x + sigma * e``, e ~ N(0, I) drawn per pixel from the step's generator, in pixel space
and not clipped to [0, 1], exactly the noise :func:`robustest.certify.smoothing.smooth_certify` certifies under.
A model trained at ``sigma`` is then certified at the same ``sigma``. ``sigma = 0`` is plain cross-entropy.

There is no inner maximisation: harden's ``eps`` only sets the radius of its robust validation and measurement
(PGD), and ``steps`` / ``alpha`` are unused. Compute per batch of B: B sample-forwards and B sample-backwards of
the update, no attack."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.amp import autocast
from robustest.core.compute import ComputeCount
from robustest.core.modelcall import forward
from robustest.core.options import checked_option
from robustest.core.validation import check_float
from robustest.train.objectives.base import Objective, StepContext, StepOutput

__all__ = ["OBJECTIVE", "step"]


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator | None,
         ctx: StepContext) -> StepOutput:
    """One step on the batch x (B x C x H x W in [0, 1]), y (int64 [B]): B x C x H x W standard normal values drawn
    from ``gen`` (harden: the epoch's generator; None: torch's global generator) on x's device, scaled by
    ``ctx.settings["sigma"]`` and added to x, then the cross-entropy of ``model`` in train mode (under the
    settings' ``amp`` autocast when they give one). Returns the loss and the noisy batch's logits B x K."""
    s = ctx.settings
    noise = torch.randn(x.shape, generator=gen, dtype=x.dtype, device=x.device)
    noisy = x + noise.mul_(float(s["sigma"]))
    model.train()
    with autocast(s.get("amp"), x.device):
        logits = forward(model, noisy)
        loss = F.cross_entropy(logits, y)
    b = x.shape[0]
    evals = torch.zeros(b, dtype=torch.long, device=x.device)
    return StepOutput(loss, logits, evals, ComputeCount(train_forward=b, train_backward=b))


OBJECTIVE = Objective(
    name="gaussian-noise", step=step,
    summary="Cohen et al.: cross-entropy under Gaussian noise (a base model for randomised smoothing)",
    options=(checked_option("sigma", 0.25, lambda v, n: check_float(n, v, lo=0.0),
                            "standard deviation of the Gaussian noise added to the training images, pixel scale "
                            "(certify at the same sigma)"),),
    diverged_hint=" or sigma",
)
