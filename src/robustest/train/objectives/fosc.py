"""``fosc``: dynamic adversarial training (Wang et al., ICML 2019). Per sample, PGD stops once the first-order
stationarity condition FOSC (= RobOT's FOL) falls to ``c_t`` or below, checked from the second gradient
evaluation on (the first step is always taken, as in the reference code); ``c_t`` falls linearly from
``fosc_c_max`` to 0 over the first ``fosc_warmup`` fraction of the epochs (:func:`robustest.train.schedules.
fosc_schedule`) and is recorded in every epoch's record as ``fosc_c``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from robustest.core.modelcall import eval_mode, frozen_params
from robustest.core.options import checked_option
from robustest.core.validation import check_float
from robustest.train.objectives.base import Objective, StepContext, StepOutput
from robustest.train.objectives.inner import adversarial_update, pgd
from robustest.train.schedules import fosc_schedule

__all__ = ["OBJECTIVE", "epoch_values", "step"]


def epoch_values(epoch: int, s: dict[str, Any]) -> dict[str, Any]:
    """The epoch's FOSC criterion ``{"fosc_c": c_t}``."""
    return {"fosc_c": fosc_schedule(epoch, s["epochs"], s["fosc_c_max"], s["fosc_warmup"])}


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, ctx: StepContext) -> StepOutput:
    """One dynamic-AT step on the batch x (B x C x H x W), y (int64 [B])."""
    steps = ctx.settings["steps"]
    with eval_mode(model), frozen_params(model):
        adv, evals = pgd(model, x, y, gen, eps=ctx.eps, alpha=ctx.alpha, steps=steps,
                         threshold=ctx.epoch["fosc_c"], first_check=1, stop_misclassified=False)
        adv = adv.detach()
    return adversarial_update(model, x, y, adv, evals, stopped=int((evals < steps).sum()))


OBJECTIVE = Objective(
    name="fosc", step=step, summary="Wang et al.: dynamic adversarial training (PGD stopped at FOSC <= c_t)",
    options=(checked_option("fosc_c_max", 0.5, lambda v, n: check_float(n, v, lo=0.0),
                            "FOSC criterion of the first epoch"),
             checked_option("fosc_warmup", 0.8, lambda v, n: check_float(n, v, lo=0.0, hi=1.0, lo_open=True),
                            "fraction of the epochs over which the criterion falls linearly to 0")),
    epoch_values=epoch_values,
)
