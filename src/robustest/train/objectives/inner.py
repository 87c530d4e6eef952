"""The inner maximisation the PGD-based objectives share: L-inf PGD from a uniform random start whose samples
may stop individually (FOL / FOSC or misclassification), the FOL of a point, and the cross-entropy update loss.

FOL / FOSC of a point x' of the L-inf ball around x (g = grad_x CE(f(x'), y), per sample):
``eps * ||g||_1 - <x' - x, g>``; it is 0 at a first-order stationary point of the inner maximisation. With a
stopping rule the batched PGD's active set shrinks: at every gradient evaluation the samples that meet their rule
keep their current point and leave the set, and the next step's forward/backward passes run on the remaining
samples only (index selection, no per-sample Python loop). The check uses the gradient the step needs anyway.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from robustest import attacks
from robustest.attacks import input_gradient, random_point
from robustest.core.modelcall import forward
from robustest.train.compute import ComputeCount

__all__ = ["attack_count", "cross_entropy_update", "fol", "pgd"]


def fol(g: torch.Tensor, delta: torch.Tensor, eps: float) -> torch.Tensor:
    """FOL / FOSC for L-inf: ``eps * ||g||_1 - <delta, g>`` per sample (g, delta = x' - x: N x ...; returns [N])."""
    gf = g.flatten(1)
    return eps * gf.abs().sum(1) - (delta.flatten(1) * gf).sum(1)


def pgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, *, eps: float, alpha: float,
        steps: int, threshold: float | None = None, first_check: int = 0, stop_misclassified: bool = False
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """L-inf PGD from a uniform random start; with a stopping rule, its samples stop individually.

    Without a rule (``threshold`` None and ``stop_misclassified`` False) every sample takes ``steps`` steps of
    ``alpha * sign(grad)``, projected into the ball and [0, 1]: :func:`robustest.attacks.pgd` drawing from
    ``gen``. With a rule, from gradient evaluation ``first_check`` on (0-based), a sample whose FOL is <=
    ``threshold`` (or, with ``stop_misclassified``, that is misclassified) keeps its current point and leaves
    the active set; only active samples go through the model (the same random start and steps otherwise).
    x: N x C x H x W, y: int64 [N]. Returns (x_adv N x C x H x W, evals: int64 [N] gradient evaluations spent on
    each sample).
    """
    n = x.shape[0]
    if threshold is None and not stop_misclassified:  # attacks' PGD: the same draws and steps, in one chunk
        adv = attacks.pgd(model, x, y, eps, alpha=alpha, steps=steps, random_start=True, batch_size=None,
                          generator=gen)
        return adv, torch.full((n,), steps, dtype=torch.long, device=x.device)
    lo, hi = (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)
    adv = random_point(x, eps, "linf", gen)
    evals = torch.zeros(n, dtype=torch.long, device=x.device)
    active = torch.arange(n, device=x.device)
    xa = adv
    for k in range(steps):
        ya = y.index_select(0, active)
        g, logits = input_gradient(model, xa, ya)
        evals.index_add_(0, active, torch.ones_like(active))
        if k >= first_check:
            stop = torch.zeros_like(ya, dtype=torch.bool)
            if threshold is not None:
                stop |= fol(g, xa - x.index_select(0, active), eps) <= threshold
            if stop_misclassified:
                stop |= logits.argmax(1) != ya
            if bool(stop.any()):
                keep = ~stop
                active, xa, g = active[keep], xa[keep], g[keep]
                if active.numel() == 0:
                    break
        xa = xa.add_(g.sign_(), alpha=alpha)
        xa = torch.max(torch.min(xa, hi.index_select(0, active)), lo.index_select(0, active))
        adv.index_copy_(0, active, xa)
    return adv, evals


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
