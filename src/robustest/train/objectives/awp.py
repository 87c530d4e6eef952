"""Adversarial weight perturbation (AWP), Wu, Xia & Wang (2020), "Adversarial Weight Perturbation Helps Robust
Generalization": a modifier of ``pgd-at`` and ``trades`` (their options ``awp_gamma`` and ``awp_warmup``).

After the inner maximisation has found the batch's adversarial inputs, the weights are moved a step up the
training loss: for every weight tensor of two or more dimensions (convolution and linear weights; biases and
normalisation parameters are left alone) ``v_l = gamma * ||w_l|| * g_l / ||g_l||``, ``g_l`` the gradient of the
method's own loss (pgd-at: the cross-entropy at the adversarial inputs; trades: ``CE(x) + beta * KL``) with
respect to ``w_l``. The loss the optimiser minimises is computed at ``w + v``; its gradient is applied to the
weights and ``v`` is taken back after the optimiser's step (``w <- w + v - lr * g(w + v) - v``). This is the
reference's single proxy step (csdongxian/AWP: a proxy model, one SGD step on the negated loss, the difference
rescaled layer by layer to ``||w_l||``): the proxy's learning rate cancels in the rescaling. The reference values
are ``gamma = 0.01`` (AT, no warm-up) and ``gamma = 0.005`` after 10 warm-up epochs (TRADES) on CIFAR-10; robustest's
default is 0 (AWP off).

The perturbation's gradient is taken in train mode (as the reference's proxy) without touching the model's buffers
(batch-norm running statistics are updated once per batch, by the update's forward, as without AWP). Compute: one
more forward and backward of the loss' inputs per batch (pgd-at: B of each; trades: 2 B forwards, 2 B backwards).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from robustest.core.options import checked_option
from robustest.core.validation import check_float, check_int
from robustest.train.objectives.base import StepContext, StepOutput

__all__ = ["OPTIONS", "Loss", "active", "attach", "perturb", "perturbation", "shift", "weights"]

#: the loss whose gradient sets the perturbation, a scalar computed with the model in its current state
Loss = Callable[[], torch.Tensor]

#: the options pgd-at and trades share (``awp_gamma`` 0: AWP off)
OPTIONS = (
    checked_option("awp_gamma", 0.0, lambda v, n: check_float(n, v, lo=0.0, hi=1.0),
                   "adversarial weight perturbation: the weights' relative step (0: off; Wu et al.: 0.01 with pgd-at, "
                   "0.005 with trades)"),
    checked_option("awp_warmup", 0, lambda v, n: check_int(n, v, lo=0),
                   "adversarial weight perturbation: epochs trained without it before it starts", kind="count"),
)


def weights(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters AWP perturbs, by name: those of two or more dimensions that require a gradient."""
    return {name: p for name, p in model.named_parameters() if p.dim() > 1 and p.requires_grad}


def active(ctx: StepContext) -> bool:
    """Whether this batch is perturbed: ``awp_gamma`` > 0 and the epoch past ``awp_warmup`` (a loop that gives no
    epoch number, 0, counts as past it)."""
    s = ctx.settings
    return s.get("awp_gamma", 0.0) > 0 and (ctx.epoch_number == 0 or ctx.epoch_number > s.get("awp_warmup", 0))


def perturbation(model: nn.Module, loss: Loss, gamma: float) -> dict[str, torch.Tensor]:
    """The weight perturbation ``v`` (name -> a tensor shaped as the weight): ``gamma * ||w|| * g / ||g||`` per
    weight of :func:`weights`, ``g`` the gradient of ``loss()`` (zero where ``g`` is zero). ``loss`` runs with the
    model in train mode; its buffers (batch-norm running statistics) are put back afterwards, and its mode."""
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    chosen = weights(model)
    was_training = model.training
    model.train()
    try:
        with torch.enable_grad():
            grads = torch.autograd.grad(loss(), list(chosen.values()), allow_unused=True)
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        model.train(was_training)
    out: dict[str, torch.Tensor] = {}
    for (name, w), g in zip(chosen.items(), grads):
        g = torch.zeros_like(w) if g is None else g.detach()
        norm = g.norm()
        out[name] = g * (gamma * w.detach().norm() / norm) if norm > 0 else torch.zeros_like(w)
    return out


def shift(model: nn.Module, v: dict[str, torch.Tensor], sign: float = 1.0) -> None:
    """Add ``sign * v`` to the model's weights in place (``sign = -1`` takes a perturbation back)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, d in v.items():
            params[name].add_(d, alpha=sign)


def perturb(model: nn.Module, loss: Loss, ctx: StepContext) -> dict[str, torch.Tensor] | None:
    """When AWP is :func:`active` for this batch: add the :func:`perturbation` of ``loss`` at ``awp_gamma`` to the
    model's weights and return it (:func:`attach` takes it back after the optimiser's step); else None."""
    if not active(ctx):
        return None
    v = perturbation(model, loss, ctx.settings["awp_gamma"])
    shift(model, v)
    return v


def attach(out: StepOutput, model: nn.Module, v: dict[str, torch.Tensor] | None, images: int) -> StepOutput:
    """``out`` with the perturbation ``v`` (from :func:`perturb`; None: unchanged) taken back after the optimiser's
    step (``out.restore``) and its compute counted: the perturbation's forward and backward of ``images``
    images."""
    if v is None:
        return out
    out.compute.train_forward += images
    out.compute.train_backward += images
    out.restore = lambda: shift(model, v, -1.0)
    return out
