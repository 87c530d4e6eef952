"""The one interface of a training objective: what a training loop needs to know about the loss it minimises.

An :class:`Objective` is a name, its method-specific options (:func:`robustest.core.options.checked_option`: name,
default, check, CLI help and kind), and a
``step`` that takes one batch and returns the loss to minimise together with the batch's statistics and compute:

    step(model, x, y, gen, ctx) -> StepOutput(loss, logits, evals, compute, stopped, terms)

``x``: float32 images B x C x H x W in [0, 1] on the model's device; ``y``: int64 labels [B]; ``gen``: the loop's
generator for the step's draws (harden: the epoch's attack generator, every random number of the step comes from
it; fit: its crop-flip generator, None without ``augment``; enhance: None, its streams are in ``ctx.extra``);
``ctx``: a :class:`StepContext` (the resolved settings, this batch's radius and step size, the epoch's values,
what the loop hands the step besides). A hardening step generates its adversarial examples (the model in eval
mode, parameters frozen), puts the model in train mode and computes the loss; the loop checks the loss is finite,
steps the optimiser and adds the compute up.

Every loop looks its objective up in the registry (:mod:`.registry`): harden the method it is given, fit
``cross-entropy``, enhance ``augmix-jsd-adv``. Only the objectives with ``harden_method`` set are offered as
``harden`` methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from robustest.core.compute import ComputeCount
from robustest.core.options import Option

__all__ = ["Objective", "StepContext", "StepFn", "StepOutput", "default_alpha"]

@dataclass(frozen=True)
class StepContext:
    """What a step knows besides its batch: ``settings`` (every resolved setting of the run, method options
    included), ``eps`` (this batch's radius: below ``settings["eps_train"]`` during the eps warm-up; 0 in a loop without
    an attack, fit), ``alpha`` (the attack step size scaled with the radius), ``epoch`` (the values of
    :attr:`Objective.epoch_values` for this epoch), ``extra`` (what a loop hands its objective besides, by name:
    enhance's AugMix stream and pool, the batch's stored adversarial copy, the model and seed of an online one) and
    the batch's place in training, for an objective with its own schedule (ibp's ramp): ``epoch_number`` (1-based),
    ``step`` (0-based, within the epoch) and ``steps_per_epoch`` (harden gives them; 0 in the other loops)."""

    settings: dict[str, Any]
    eps: float = 0.0
    alpha: float = 0.0
    epoch: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    epoch_number: int = 0
    step: int = 0
    steps_per_epoch: int = 0


@dataclass
class StepOutput:
    """A step's result. ``loss``: the scalar to minimise (graph attached); ``logits``: B x K train-mode logits of
    the loss' adversarial term (the epoch's ``adv_accuracy``); ``evals``: int64 [B], gradient evaluations of the
    inner maximisation per sample; ``compute``: the step's sample-forwards and -backwards (attack and update);
    ``stopped``: samples whose attack stopped before the step budget; ``terms``: named scalar parts of the loss
    that a loop records (enhance: ``ce``, ``jsd``, ``adv``); ``values``: the step's schedule values that harden's
    epoch record keeps, the epoch's last batch's (ibp: ``eps``, in place of the eps warm-up's radius, and
    ``kappa``); ``restore``: what the loop calls right after the optimiser's step (AWP takes its weight perturbation
    back), or None."""

    loss: torch.Tensor
    logits: torch.Tensor
    evals: torch.Tensor
    compute: ComputeCount
    stopped: int = 0
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    restore: Callable[[], None] | None = None


class StepFn(Protocol):
    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator | None,
                 ctx: StepContext) -> StepOutput: ...


def default_alpha(eps: float, steps: int) -> float:
    """The usual PGD step: ``2.5 * eps / steps`` (Madry et al.)."""
    return 2.5 * eps / steps


@dataclass(frozen=True)
class Objective:
    """A training objective: a hardening method, or the loss of another loop (``harden_method`` False).

    ``name``: its registry name (lower case, ``-`` separated); ``step``: see the module docstring; ``summary``: one
    line for listings; ``harden_method``: offered as a ``harden`` method (listed by :func:`~.registry.names`, a
    ``harden --method`` choice and a RobOT hardening strategy, its options harden's keywords), False for the
    objective of another loop, looked up by name (fit's ``cross-entropy``, enhance's ``augmix-jsd-adv``); the
    fields below are harden's and the other loops ignore them. ``options``: its method-specific settings,
    resolved in this order after the common ones;
    ``fixed_steps``: the number of attack steps when the method allows no other (fast-at: 1), else None;
    ``alpha(eps, steps)``: the default step size, ``alpha_doc`` how it reads; ``epoch_values(epoch, settings)``:
    per-epoch values the steps read from ``ctx.epoch`` and the epoch's record keeps (fosc's c_t), or None;
    ``check(settings)``: checks across the resolved settings, or None; ``co_guard``: None when the
    catastrophic-overfitting guard does not apply, else its default (fast-at: True); ``diverged_hint``: added to
    the error when the loss is not finite (e.g. " or beta"); ``certificates``: the bound-propagation certificates
    (``ibp``, ``crown``: :mod:`robustest.certify`) the harden verb reports by default for a model trained with it
    (ibp, crown-ibp: both).
    """

    name: str
    step: StepFn
    summary: str = ""
    options: tuple[Option, ...] = ()  # robustest.core.options.checked_option
    fixed_steps: int | None = None
    alpha: Callable[[float, int], float] = default_alpha
    alpha_doc: str = "2.5 * eps / steps"
    epoch_values: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None
    check: Callable[[dict[str, Any]], None] | None = None
    co_guard: bool | None = None
    diverged_hint: str = ""
    harden_method: bool = True
    certificates: tuple[str, ...] = ()
