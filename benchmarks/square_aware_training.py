"""Experiment: does training against what Square finds remove the ``gradient-free-breaks`` flag of MNIST models?

Runs ``robustest harden`` with pgd-at's inner maximisation or update loss changed in this process only (nothing here
is part of the package), so that the verb's own evaluation (``--autoattack standard``) measures each variant:

* ``--start uniform|vertex|stripes``: the PGD start, uniform in the ball (pgd-at's own PGD), a random vertex of the
  ball (every pixel +-eps, as Square's perturbations), or Square's initialisation (vertical stripes of +-eps);
* ``--search R``: after the PGD, R rounds of a Square-like random search (forward passes only): one random square
  of side sqrt(p * H * W) (p from 0.33 down to 0.03) set to a random vertex per image and channel, kept where it
  raises the margin loss max_{k != y} z_k - z_y;
* ``--linearity L``: the update loss ``CE(x') + L * |CE(x') - CE(x) - <x' - x, grad_x CE(x)>|`` (a local-linearity
  penalty at the PGD point, Qin et al. 2019, by double back-propagation) instead of ``CE(x')``;
* ``--ibp W --ibp-eps F``: the update loss ``CE(x') + W * CE(-m, y)``, m the interval bounds of the margins on the
  L-inf ball around x of F times the batch's training radius (so it follows the eps warm-up; at a fixed radius the
  bounds of the untrained network swamp the loss and training never starts) (``robustest.certify.margin_bounds``, as
  ibp's objective trains them): certified training's bound as a regulariser of pgd-at.

harden's count of forward and backward passes leaves out the search's forward passes, the penalty's second
backward pass and the bounds' passes; its ``training_cpu_s`` includes them. Everything after ``--`` goes to
``robustest harden``; e.g. (benchmarks/results/2026-12-05-frontier-cyclic-recipe.md)::

    python benchmarks/square_aware_training.py --start vertex -- --dataset mnist --data-dir mnist.npz \\
        --model mnist_small --from-scratch --method pgd-at --eps 0.3 --eps-train 0.4 --schedule cyclic --lr 5e-3 \\
        --eps-warmup 0.5 --epochs 10 --batch-size 100 --threads 1 --limit 21000 --test-limit 1000 \\
        --whitebox-limit 1000 --autoattack standard --out OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch
import torch.nn.functional as F

from robustest._entry import main
from robustest.attacks import margin, project, random_point
from robustest.certify import margin_bounds
from robustest.core.modelcall import forward
from robustest.train.objectives import pgd_at
from robustest.train.objectives.base import StepOutput
from robustest.train.objectives.ibp import model_graph
from robustest.train.objectives.inner import adversarial_update, attack_count


def start(x: torch.Tensor, eps: float, gen: torch.Generator, law: str) -> torch.Tensor:
    """The PGD start (B x C x H x W) around x under ``law``, in the ball and [0, 1]."""
    if law == "uniform":
        return random_point(x, eps, "linf", gen)
    b, c, _, w = x.shape
    shape = x.shape if law == "vertex" else (b, c, 1, w)
    d = (torch.randint(0, 2, shape, generator=gen, device=x.device).float() * 2 - 1) * eps
    return (x + d).clamp(0, 1)


@torch.no_grad()
def search(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, adv: torch.Tensor, eps: float,
           gen: torch.Generator, rounds: int) -> torch.Tensor:
    """``rounds`` rounds of the Square-like random search from ``adv`` (see the module's docstring)."""
    b, c, h, w = x.shape
    best = -margin(forward(model, adv), y)  # the margin loss max_{k != y} z_k - z_y
    for r in range(rounds):
        side = max(1, round(((0.3 * (1 - r / rounds) + 0.03) * h * w) ** 0.5))
        i, j = (int(torch.randint(0, n - side + 1, (1,), generator=gen)) for n in (h, w))
        sign = (torch.randint(0, 2, (b, c, 1, 1), generator=gen, device=x.device).float() * 2 - 1) * eps
        cand = adv.clone()
        cand[:, :, i:i + side, j:j + side] = (x[:, :, i:i + side, j:j + side] + sign).clamp(0, 1)
        m = -margin(forward(model, cand), y)
        better = m > best
        adv, best = torch.where(better[:, None, None, None], cand, adv), torch.where(better, m, best)
    return adv


def patch(law: str, rounds: int, weight: float, ibp: float = 0.0, ibp_eps: float = 0.25) -> None:
    """Replace pgd-at's inner maximisation (and, with ``weight`` or ``ibp`` > 0, its update) in this process."""
    radius = {}  # the batch's training radius, as pgd-at's PGD receives it

    def pgd(model, x, y, gen, *, eps, alpha, steps, **_):
        adv, lo, hi = start(x, eps, gen, law), (x - eps).clamp(min=0), (x + eps).clamp(max=1)
        for _ in range(steps):
            adv.requires_grad_(True)
            (g,) = torch.autograd.grad(F.cross_entropy(forward(model, adv), y, reduction="sum"), adv)
            adv = project(adv.detach() + alpha * g.sign(), x, eps, "linf", lo, hi)
        adv = search(model, x, y, adv.detach(), eps, gen, rounds) if rounds else adv.detach()
        return adv, torch.full((x.shape[0],), steps, dtype=torch.long, device=x.device)

    def update(model, x, y, adv, evals, mix=0.0, stopped=0):
        count, b = attack_count(evals), x.shape[0]
        model.train()
        xr = x.clone().requires_grad_(True)
        logits = forward(model, torch.cat([xr, adv]))
        loss = F.cross_entropy(logits, torch.cat([y, y]), reduction="none")
        (g,) = torch.autograd.grad(loss[:b].sum(), xr, create_graph=True)
        gap = (loss[b:] - loss[:b] - ((adv - x) * g).flatten(1).sum(1)).abs()
        count.train_forward = count.train_backward = 2 * b
        return StepOutput(loss[b:].mean() + weight * gap.mean(), logits[b:], evals, count, stopped=stopped)

    def noting_pgd(model, x, y, gen, *, eps, **kw):
        radius["eps"] = eps
        return own_pgd(model, x, y, gen, eps=eps, **kw)

    def bounded(model, x, y, adv, evals, mix=0.0, stopped=0):
        out = adversarial_update(model, x, y, adv, evals, mix, stopped)  # CE(x'), the model in train mode
        robust = -margin_bounds(model, x, y, ibp_eps * radius["eps"], "linf", "ibp", graph=model_graph(model, x))
        return dataclasses.replace(out, loss=out.loss + ibp * F.cross_entropy(robust, y))

    if law != "uniform" or rounds:  # else pgd-at's own PGD
        pgd_at.pgd = pgd
    if ibp > 0:  # the PGD in effect (pgd-at's own or the one above), noting the radius for the bounds
        own_pgd = pgd_at.pgd
        pgd_at.pgd = noting_pgd
    if weight > 0:
        pgd_at.adversarial_update = update
    elif ibp > 0:
        pgd_at.adversarial_update = bounded


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--start", choices=("uniform", "vertex", "stripes"), default="uniform")
    p.add_argument("--search", type=int, default=0, metavar="R")
    p.add_argument("--linearity", type=float, default=0.0, metavar="L")
    p.add_argument("--ibp", type=float, default=0.0, metavar="W")
    p.add_argument("--ibp-eps", type=float, default=0.25, metavar="F")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = p.parse_args(argv[:cut])
    if a.ibp and a.linearity:
        p.error("--ibp and --linearity each replace the update: give one")
    patch(a.start, a.search, a.linearity, a.ibp, a.ibp_eps)
    sys.exit(main(["harden", *argv[cut + 1:]]))
