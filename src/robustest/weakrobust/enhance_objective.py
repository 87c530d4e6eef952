"""``augmix-jsd-adv``: the training objective of targeted enhancement (:func:`robustest.weakrobust.enhance`,
METHODS B3), ``L = CE(x) + jsd_weight * JSD(p(x), p(aug1), p(aug2)) + adv_weight * CE(x_adv)``.

``aug1`` / ``aug2``: two independent AugMix mixtures of the batch (with ``augmix``); ``x_adv``: its adversarial
copy (with ``adversarial``), the one the loop stored or L-inf PGD made here. It lives in weakrobust, whose AugMix
it needs (train may not import weakrobust), and :mod:`robustest.weakrobust` registers it in
:mod:`robustest.train.objectives` when imported. Not a harden method.

Its :class:`~robustest.train.objectives.StepContext`: ``settings`` are enhance's (``augmix``, ``adversarial``,
``jsd_weight``, ``adv_weight``, ``adv_steps``, ``width``, ``severity``), ``eps`` / ``alpha`` the adversarial
copy's radius and step, and ``extra`` holds ``rng`` (the AugMix stream, a numpy Generator), ``ops`` (the
augmentation pool's operations), ``adv`` (the batch's stored adversarial copy B x C x H x W on the device, or
None) and, when there is none, ``attack_model`` and ``attack_seed`` (the model PGD runs against and its seed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from robustest import attacks
from robustest.core.compute import ComputeCount
from robustest.core.modelcall import forward, set_mode
from robustest.train.objectives import Objective, StepContext, StepOutput
from robustest.weakrobust.augment import _augmix, _jsd

__all__ = ["OBJECTIVE", "step"]


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator | None,
         ctx: StepContext) -> StepOutput:
    """One enhancement step on x (B x C x H x W), y (int64 [B]): the AugMix mixtures and the adversarial copy,
    then one forward of ``model`` in train mode over all of them -> the loss, the clean logits B x K and the terms
    ``ce``, ``jsd``, ``adv`` (scalars; a term switched off is 0). ``gen`` is unused: the draws come from
    ``ctx.extra``."""
    inputs = _inputs(x, y, ctx)
    s, b = ctx.settings, x.shape[0]
    set_mode(model, True)
    logits = forward(model, torch.cat(inputs)).split(b)
    ce = F.cross_entropy(logits[0], y)
    loss = ce
    jsd = adv = torch.zeros((), device=x.device)
    if s["augmix"]:
        jsd = _jsd(logits[:3])
        loss = loss + s["jsd_weight"] * jsd
    if s["adversarial"]:
        adv = F.cross_entropy(logits[-1], y)
        loss = loss + s["adv_weight"] * adv
    online = s["adversarial"] and ctx.extra.get("adv") is None
    attack = b * s["adv_steps"] if online else 0
    evals = torch.full((b,), s["adv_steps"] if online else 0, dtype=torch.long, device=x.device)
    count = ComputeCount(attack_forward=attack, attack_backward=attack, train_forward=len(inputs) * b,
                         train_backward=len(inputs) * b)
    return StepOutput(loss, logits[0], evals, count, terms={"ce": ce, "jsd": jsd, "adv": adv})


def _inputs(x: torch.Tensor, y: torch.Tensor, ctx: StepContext) -> list[torch.Tensor]:
    """The images the loss needs, each B x C x H x W: the batch, its two AugMix mixtures (with ``augmix``), then
    its adversarial copy (with ``adversarial``: the stored one, else PGD against ``attack_model``)."""
    s, extra = ctx.settings, ctx.extra
    inputs = [x]
    if s["augmix"]:
        inputs += [_augmix(x, extra["ops"], extra["rng"], s["width"], -1, s["severity"]),
                   _augmix(x, extra["ops"], extra["rng"], s["width"], -1, s["severity"])]
    if s["adversarial"]:
        adv = extra.get("adv")
        if adv is None:
            adv = attacks.pgd(extra["attack_model"], x, y, eps=ctx.eps, alpha=ctx.alpha, steps=s["adv_steps"],
                              seed=extra["attack_seed"]).detach()
        inputs.append(adv)
    return inputs


OBJECTIVE = Objective(name="augmix-jsd-adv", step=step, harden_method=False,
                      summary="AugMix + Jensen-Shannon consistency + an adversarial copy (enhance's training loss)")
