"""The inner maximisation the PGD-based objectives share: L-inf PGD from a uniform random start whose samples
may stop individually (FOL / FOSC or misclassification), the FOL of a point, and the cross-entropy update loss.

FOL / FOSC of a point x' of the L-inf ball around x (g = grad_x CE(f(x'), y), per sample):
``eps * ||g||_1 - <x' - x, g>``; it is 0 at a first-order stationary point of the inner maximisation. With a
stopping rule (a ``stop=`` rule of :func:`robustest.attacks.pgd`) the batched PGD's active set shrinks: at every
gradient evaluation the samples that meet their rule keep their current point and leave the set, and the next
step's forward/backward passes run on the remaining samples only (index selection, no per-sample Python loop).
The check uses the gradient the step needs anyway.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from robustest import attacks
from robustest.core.compute import ComputeCount
from robustest.core.modelcall import forward
from robustest.train.objectives.base import StepOutput

__all__ = ["adversarial_update", "attack_count", "cross_entropy_update", "fol", "pgd"]


def fol(g: torch.Tensor, delta: torch.Tensor, eps: float) -> torch.Tensor:
    """FOL / FOSC for L-inf: ``eps * ||g||_1 - <delta, g>`` per sample (g, delta = x' - x: N x ...; returns [N])."""
    gf = g.flatten(1)
    return eps * gf.abs().sum(1) - (delta.flatten(1) * gf).sum(1)


def pgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, *, eps: float, alpha: float,
        steps: int, threshold: float | None = None, first_check: int = 0, stop_misclassified: bool = False
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """L-inf PGD from a uniform random start (:func:`robustest.attacks.pgd` drawing from ``gen``, in one chunk);
    with a stopping rule, its samples stop individually.

    Without a rule (``threshold`` None and ``stop_misclassified`` False) every sample takes ``steps`` steps of
    ``alpha * sign(grad)``, projected into the ball and [0, 1]. With a rule, from gradient evaluation
    ``first_check`` on (0-based), a sample whose FOL is <= ``threshold`` (or, with ``stop_misclassified``, that
    is misclassified) keeps its current point and leaves the active set; only active samples go through the
    model (the same random start and steps otherwise). x: N x C x H x W, y: int64 [N]. Returns (x_adv
    N x C x H x W, evals: int64 [N] gradient evaluations spent on each sample).
    """
    rule = None
    if threshold is not None or stop_misclassified:
        def rule(k: int, xa: torch.Tensor, g: torch.Tensor, logits: torch.Tensor, index: torch.Tensor
                 ) -> torch.Tensor:
            stop = torch.zeros_like(index, dtype=torch.bool)
            if threshold is not None:
                stop |= fol(g, xa - x.index_select(0, index), eps) <= threshold
            if stop_misclassified:
                stop |= logits.argmax(1) != y.index_select(0, index)
            return stop

    res = attacks.pgd(model, x, y, eps, alpha=alpha, steps=steps, random_start=True, batch_size=None,
                      generator=gen, stop=rule, stop_from=first_check, return_details=True)
    return res.adv, res.evals


def attack_count(evals: torch.Tensor) -> ComputeCount:
    """The compute of an inner maximisation whose samples took ``evals`` (int64 [B]) gradient evaluations: one
    sample-forward and one sample-backward each."""
    n_evals = int(evals.sum())
    return ComputeCount(attack_forward=n_evals, attack_backward=n_evals)


def cross_entropy_update(model: nn.Module, x: torch.Tensor, y: torch.Tensor, adv: torch.Tensor | None,
                         mix: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The update loss ``mix * CE(x) + (1 - mix) * CE(x_adv)`` in the model's current (train) mode: one forward
    over clean and adversarial images together when both terms count. ``adv`` None (``mix = 1``): clean training.
    Returns (loss, logits of the adversarial term B x K (the clean ones when ``adv`` is None), sample-forwards)."""
    b = x.shape[0]
    if mix > 0.0:
        if adv is None:
            logits_adv = forward(model, x)
            return F.cross_entropy(logits_adv, y), logits_adv, b
        logits = forward(model, torch.cat([x, adv]))
        logits_nat, logits_adv = logits[:b], logits[b:]
        loss = mix * F.cross_entropy(logits_nat, y) + (1 - mix) * F.cross_entropy(logits_adv, y)
        return loss, logits_adv, 2 * b
    logits_adv = forward(model, adv)
    return F.cross_entropy(logits_adv, y), logits_adv, b


def adversarial_update(model: nn.Module, x: torch.Tensor, y: torch.Tensor, adv: torch.Tensor | None,
                       evals: torch.Tensor, mix: float = 0.0, stopped: int = 0) -> StepOutput:
    """The update of the objectives that train on an attack's points: the model to train mode, the loss of
    :func:`cross_entropy_update` on x (B x C x H x W), y (int64 [B]) and ``adv`` (None: clean training), with the
    compute of the attack (``evals``, int64 [B]: gradient evaluations per sample, :func:`attack_count`) and of the
    update (one sample-forward and one sample-backward per image it used). ``stopped``: the samples whose attack
    stopped before its budget."""
    count = attack_count(evals)
    model.train()
    loss, logits, used = cross_entropy_update(model, x, y, adv, mix)
    count.train_forward = count.train_backward = used
    return StepOutput(loss, logits, evals, count, stopped=stopped)
