"""``fol-budget``: per sample, PGD stops as soon as its FOL falls to ``fol_threshold`` or below, or (with
``stop_misclassified``) the sample is misclassified, checked from gradient evaluation ``fol_min_steps`` on: easy
samples cost one or two gradient evaluations, hard ones the full budget."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from robustest.core.errors import ConfigError
from robustest.core.modelcall import eval_mode, frozen_params
from robustest.core.options import checked_option
from robustest.core.validation import check_float, check_int
from robustest.train.objectives.base import Objective, StepContext, StepOutput
from robustest.train.objectives.inner import adversarial_update, pgd

__all__ = ["OBJECTIVE", "check", "step"]


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, ctx: StepContext) -> StepOutput:
    """One FOL-budgeted PGD-AT step on the batch x (B x C x H x W), y (int64 [B])."""
    s = ctx.settings
    with eval_mode(model), frozen_params(model):
        adv, evals = pgd(model, x, y, gen, eps=ctx.eps, alpha=ctx.alpha, steps=s["steps"],
                         threshold=s["fol_threshold"], first_check=s["fol_min_steps"],
                         stop_misclassified=s["stop_misclassified"])
        adv = adv.detach()
    return adversarial_update(model, x, y, adv, evals, stopped=int((evals < s["steps"]).sum()))


def check(s: dict[str, Any]) -> None:
    """The stopping rule must be able to apply: ``fol_min_steps`` below ``steps``."""
    if s["fol_min_steps"] >= s["steps"]:
        raise ConfigError(f"fol_min_steps ({s['fol_min_steps']}) must be below steps ({s['steps']}), or the "
                          "stopping rule never applies: use pgd-at")


OBJECTIVE = Objective(
    name="fol-budget", step=step, summary="PGD-AT whose samples stop at FOL <= fol_threshold or misclassification",
    options=(checked_option("fol_threshold", 0.1, lambda v, n: check_float(n, v, lo=0.0),
                            "stop a sample's attack once its FOL is at most this"),
             checked_option("stop_misclassified", True, lambda v, n: bool(v),
                            "do not stop a sample's attack when it is misclassified", "switch"),
             checked_option("fol_min_steps", 2, lambda v, n: check_int(n, v, lo=0),
                            "steps every sample takes before the rule applies", "count")),
    check=check,
)
