"""Schedules of training, stepped once per batch: the learning rate (:func:`make_schedule`), the attack radius
of adversarial training (:func:`eps_schedule`, a linear warm-up), dynamic adversarial training's FOSC
criterion (:func:`fosc_schedule`, per epoch) and certified training's ramp (:func:`ramp_schedule`: after a
warm-up, the radius of the bounds and the weights of the loss terms move linearly to their final values)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch

__all__ = ["CYCLIC_PEAK", "SCHEDULES", "ScheduleOptions", "eps_schedule", "fosc_schedule", "make_schedule",
           "ramp_schedule"]

SCHEDULES = ("cosine", "step", "cyclic")
#: where the cyclic schedule peaks, as a fraction of training (Wong et al. 2020: 2/5 of the epochs)
CYCLIC_PEAK = 0.4


class ScheduleOptions(Protocol):
    """What :func:`make_schedule` reads of a recipe (:class:`robustest.train.recipes.Recipe` has them):
    the schedule's name (one of :data:`SCHEDULES`, or None), the warm-up in epochs, the step schedule's epochs."""

    schedule: str | None
    warmup_epochs: float
    milestones: Sequence[float] | None


def make_schedule(opt: torch.optim.Optimizer, opts: ScheduleOptions, epochs: int, steps_per_epoch: int
                  ) -> torch.optim.lr_scheduler.LambdaLR | None:
    """A per-batch LR schedule: ``warmup_epochs`` of linear warm-up ((s + 1) / warm-up steps), then constant,
    cosine (from the end of warm-up to 0 at the last step) or step (x0.1 at each milestone epoch; by default
    at 50 % and 75 % of training), or cyclic: linear from 0 up to the rate at :data:`CYCLIC_PEAK` of training,
    then linear down to 0 at the last step (Wong et al. 2020's one-cycle triangle; no separate warm-up). None
    when there is neither a schedule nor a warm-up."""
    total = max(1, epochs * steps_per_epoch)
    warm = int(round(opts.warmup_epochs * steps_per_epoch))
    if opts.schedule is None and warm == 0:
        return None
    if opts.schedule == "cyclic":
        peak = max(1.0, CYCLIC_PEAK * total)

        def cyclic(s: int) -> float:
            t = s + 1  # the rate of step s; the first step trains at 1/peak of the rate, not at 0
            return t / peak if t <= peak else max(0.0, (total - t) / max(1.0, total - peak))

        return torch.optim.lr_scheduler.LambdaLR(opt, cyclic)
    if opts.schedule == "cosine":
        span = max(1, total - warm)

        def after(s: int) -> float:
            return 0.5 * (1 + math.cos(math.pi * min(s - warm, span) / span))
    elif opts.schedule == "step":
        marks = ([0.5 * total, 0.75 * total] if opts.milestones is None
                 else [m * steps_per_epoch for m in opts.milestones])

        def after(s: int) -> float:
            return 0.1 ** sum(s >= m for m in marks)
    else:
        def after(s: int) -> float:
            return 1.0

    if warm == 0:
        return torch.optim.lr_scheduler.LambdaLR(opt, after)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else after(s))


def fosc_schedule(epoch: int, epochs: int, c_max: float, warmup: float) -> float:
    """Dynamic AT's criterion for ``epoch`` (1-based) of ``epochs``: ``c_max * max(0, 1 - (epoch - 1) / T')`` with
    ``T' = warmup * epochs`` (the reference code: ``c_max - c_max * ep / dynamic_epoch``, ep 0-based)."""
    return float(c_max * max(0.0, 1.0 - (epoch - 1) / (warmup * epochs)))


def eps_schedule(step: int, total_steps: int, eps: float, warmup: float) -> float:
    """The radius of training step ``step`` (0-based) of ``total_steps``: ``eps * min(1, (step + 1) / W)`` with
    ``W = warmup * total_steps`` steps of linear warm-up (``warmup = 0``: ``eps`` from the first step)."""
    w = warmup * total_steps
    if w <= 1.0:
        return float(eps)
    return float(eps * min(1.0, (step + 1) / w))


def ramp_schedule(step: int, total_steps: int, warmup: float, length: float) -> float:
    """How far certified training's ramp has come at training step ``step`` (0-based) of ``total_steps``, in
    [0, 1]: 0 for the first ``S = warmup * total_steps`` steps, then ``min(1, (step + 1 - S) / L)`` over the
    ``L = length * total_steps`` steps of the ramp (as :func:`eps_schedule`: the ramp's last step reaches 1), 1
    after it. Gowal et al. (2018) and Zhang et al. (2020) move the radius from 0 to its target, and the weight of
    the clean loss (and CROWN-IBP's weight of its bound) from 1 to their final values, linearly along it."""
    start, span = warmup * total_steps, length * total_steps
    done = step + 1 - start
    if done <= 0.0:
        return 0.0
    if span <= 1.0:
        return 1.0
    return float(min(1.0, done / span))
