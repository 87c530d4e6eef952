"""``cross-entropy``: the plain training objective :func:`robustest.train.fit` uses. The cross-entropy of the
model's logits on the batch as it comes (crop-flipped by fit with ``augment``), with ``label_smoothing`` when the
settings give one, the forward and the loss under the settings' ``amp`` autocast. Not a harden method. Compute per
batch of B: B sample-forwards and B sample-backwards of the update, no attack."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.amp import autocast
from robustest.core.compute import ComputeCount
from robustest.core.modelcall import forward
from robustest.train.objectives.base import Objective, StepContext, StepOutput

__all__ = ["OBJECTIVE", "step"]


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator | None,
         ctx: StepContext) -> StepOutput:
    """The cross-entropy of ``model`` (in its current mode: fit's train mode) on x (B x C x H x W), y (int64 [B]);
    ``ctx.settings``: ``label_smoothing`` (0 or absent: none) and ``amp`` (None or absent: float32). Draws
    nothing (``gen`` unused). Returns the loss and the logits B x K (in the autocast dtype with ``amp``)."""
    s = ctx.settings
    smoothing = s.get("label_smoothing") or 0.0
    with autocast(s.get("amp"), x.device):
        logits = forward(model, x)
        loss = F.cross_entropy(logits, y, label_smoothing=smoothing) if smoothing else F.cross_entropy(logits, y)
    b = x.shape[0]
    evals = torch.zeros(b, dtype=torch.long, device=x.device)
    return StepOutput(loss, logits, evals, ComputeCount(train_forward=b, train_backward=b))


OBJECTIVE = Objective(name="cross-entropy", step=step, summary="cross-entropy on the batch (fit's training loss)",
                      harden_method=False)
