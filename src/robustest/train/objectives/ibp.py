"""``ibp``: interval bound propagation training (Gowal et al. 2018). The loss is

    kappa * CE(z(x), y) + (1 - kappa) * CE(-m(x, eps_t), y)

with ``m`` (B x K) IBP's lower bounds on the margins ``z_y - z_j`` over the L-inf ball of radius ``eps_t`` around
each image, clipped to [0, 1] (:func:`robustest.certify.margin_bounds`; column y is 0): ``-m`` are the worst-case
logits the bounds allow, and a sample whose ``-m`` puts the label first is certified at ``eps_t``.

The schedule follows the batch's place in training (:func:`robustest.train.schedules.ramp_schedule`): the first
``ramp_warmup`` of the training steps train on clean images only (``eps_t`` 0, ``kappa`` 1); over the next
``ramp_length`` of them ``eps_t`` rises linearly from 0 to harden's ``eps_train`` (default: the run's eps; Gowal et al.
and Zhang et al. train at 0.4 for a test radius of 0.3) and ``kappa`` falls linearly from 1 to ``kappa_end`` (Gowal's
0.5); then both hold. harden's eps warm-up, ``steps`` and ``alpha`` do not apply (there is no attack); ``eps`` is the
radius of robust validation and measurement. Every epoch's record keeps the last batch's ``eps`` (the bounds' radius)
and ``kappa``; its ``adv_accuracy`` is the share of training images certified at that radius (in train mode).

Both terms run in train mode (dropout in the clean term; the bounds treat dropout as the identity and BatchNorm
with its running statistics). The model's graph is traced once per model, image shape, dtype and device and kept
while the model lives (:func:`model_graph`; it refers to the live parameters, so it follows training; replace no
layer of a model in the middle of training). Compute per batch of B: B passes of the clean term and, once the
ramp has begun, 2 B of the bounds (the interval's centre and radius through every layer). :mod:`.crown_ibp`
builds on the same step.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from robustest.certify import check_certifiable, margin_bounds
from robustest.certify.graph import Graph
from robustest.core.compute import ComputeCount
from robustest.core.errors import ConfigError
from robustest.core.modelcall import eval_mode, forward
from robustest.core.options import Option, checked_option
from robustest.core.validation import check_float
from robustest.train.objectives.base import Objective, StepContext, StepOutput
from robustest.train.schedules import ramp_schedule

__all__ = ["OBJECTIVE", "RAMP_LENGTH", "RAMP_WARMUP", "Bounds", "certified_step", "check_ramp",
           "kappa_end", "model_graph", "ramp", "step"]

#: the robust margins of a batch at a radius and ramp position: (model, x, y, eps, graph, ramp, settings) ->
#: (margins B x K, passes per sample spent on them, schedule values to record)
Bounds = Callable[[nn.Module, torch.Tensor, torch.Tensor, float, Graph, float, dict[str, Any]],
                  tuple[torch.Tensor, int, dict[str, float]]]

RAMP_WARMUP = checked_option("ramp_warmup", 0.05, lambda v, n: check_float(n, v, lo=0.0, hi=1.0),
                             "fraction of the training steps of clean training (radius 0, kappa 1) before the ramp")
RAMP_LENGTH = checked_option("ramp_length", 0.5, lambda v, n: check_float(n, v, lo=0.0, hi=1.0, lo_open=True),
                             "fraction of the training steps over which the bounds' radius rises linearly from 0 to "
                             "eps_train and kappa falls from 1 to kappa_end")

_GRAPHS: weakref.WeakKeyDictionary[nn.Module, dict[tuple[Any, ...], Graph]] = weakref.WeakKeyDictionary()


def kappa_end(default: float) -> Option:
    """The ``kappa_end`` option with ``default`` (ibp 0.5 as Gowal et al., crown-ibp 0 as Zhang et al.)."""
    return checked_option("kappa_end", default, lambda v, n: check_float(n, v, lo=0.0, hi=1.0),
                          "weight of the clean cross-entropy after the ramp, from 1 before it (1 - kappa: the bounds' "
                          "robust cross-entropy); crown-ibp's default: 0")


def check_ramp(s: dict[str, Any]) -> None:
    """Refuse a ramp that does not end within training."""
    if s["ramp_warmup"] + s["ramp_length"] > 1.0 + 1e-12:
        raise ConfigError(f"ramp_warmup + ramp_length must be at most 1 (the ramp ends within training), got "
                          f"{s['ramp_warmup']:g} + {s['ramp_length']:g}")


def model_graph(model: nn.Module, x: torch.Tensor) -> Graph:
    """The bound-propagation graph of ``model`` (:func:`robustest.certify.check_certifiable`) for images shaped
    as x's (B x C x H x W), traced once per model, image shape, dtype and device and kept while the model lives.
    Tracing runs one forward pass in eval mode, so BatchNorm's running statistics stay as they are."""
    graphs = _GRAPHS.setdefault(model, {})
    key = (tuple(x.shape[1:]), x.dtype, str(x.device))
    if key not in graphs:
        with eval_mode(model):
            graphs[key] = check_certifiable(model, key[0])
    return graphs[key]


def ramp(ctx: StepContext, name: str) -> float:
    """The ramp's position in [0, 1] at the batch of ``ctx`` (its epoch, step and steps per epoch)."""
    per_epoch = ctx.steps_per_epoch
    if per_epoch < 1 or ctx.epoch_number < 1:
        raise ConfigError(f"{name} ramps its radius over training: its step needs the batch's place in training "
                          "(StepContext epoch_number, step, steps_per_epoch), which harden gives")
    s = ctx.settings
    return ramp_schedule((ctx.epoch_number - 1) * per_epoch + ctx.step, s["epochs"] * per_epoch,
                         s["ramp_warmup"], s["ramp_length"])


def certified_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ctx: StepContext, name: str,
                   bounds: Bounds) -> StepOutput:
    """One certified-training step on x (B x C x H x W in [0, 1]), y (int64 [B]):
    ``kappa * CE(z(x), y) + (1 - kappa) * CE(-m, y)`` with ``m = bounds(...)`` at the schedule's radius; the bounds
    are skipped while kappa is 1 (the warm-up) and the clean term's backward while kappa is 0."""
    s, b = ctx.settings, x.shape[0]
    r = ramp(ctx, name)
    eps_t = float(s["eps_train"]) * r
    kappa = 1.0 - (1.0 - float(s["kappa_end"])) * r
    model.train()
    with torch.set_grad_enabled(kappa > 0.0):  # the clean forward also keeps BatchNorm's statistics current
        logits = forward(model, x)
    count = ComputeCount(train_forward=b, train_backward=b if kappa > 0.0 else 0)
    values = {"eps": eps_t, "kappa": kappa}
    if kappa == 1.0:
        return StepOutput(F.cross_entropy(logits, y), logits, _no_evals(x), count, values=values)
    margins, passes, more = bounds(model, x, y, eps_t, model_graph(model, x), r, s)
    robust = -margins
    loss = (1.0 - kappa) * F.cross_entropy(robust, y)
    if kappa > 0.0:
        loss = kappa * F.cross_entropy(logits, y) + loss
    count.train_forward += passes * b
    count.train_backward += passes * b
    return StepOutput(loss, robust, _no_evals(x), count, values={**values, **more})


def _no_evals(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros(x.shape[0], dtype=torch.long, device=x.device)


def _ibp_bounds(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, graph: Graph, r: float,
                s: dict[str, Any]) -> tuple[torch.Tensor, int, dict[str, float]]:
    return margin_bounds(model, x, y, eps, "linf", "ibp", graph=graph), 2, {}


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator | None,
         ctx: StepContext) -> StepOutput:
    """One IBP-training step on the batch x (B x C x H x W), y (int64 [B]); draws no random number."""
    return certified_step(model, x, y, ctx, "ibp", _ibp_bounds)


OBJECTIVE = Objective(
    name="ibp", step=step, summary="Gowal et al.: interval bound propagation (certified training)",
    options=(RAMP_WARMUP, RAMP_LENGTH, kappa_end(0.5)), check=check_ramp, certificates=("ibp", "crown"),
)
