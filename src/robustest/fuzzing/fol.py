"""FOL-guided fuzzing (RobOT, Wang et al. ICSE 2021; METHODS.md A3), batched over seeds.

Per seed ``x0`` with predicted class ``c`` the fuzzer keeps a FIFO work list that starts as ``[x0]``. Each
iteration pops one item and takes two gradient-ascent steps on

    obj(x) = FOL_L2(x) - p_c(x),   FOL_L2(x) = ||grad_x CE(f(x), c)||_2

(a second-order backward pass, done by autograd with ``create_graph=True``):
``x <- clip(x + lr * u * grad_x obj(x), 0, 1)``, ``u ~ U[0.5, 1.5)``. After each step the candidate joins the
seed's work list if its FOL_L2 exceeds the best FOL_L2 seen for that seed and ``||x - x0||_2 / ||x0||_2 <
max_rel_l2``; it is recorded as a test if the model's prediction differs from ``c``. A seed ends when its work
list is empty or its budget is spent. Seeds whose loss gradient has ``||grad||_2 <= grad_threshold`` are
skipped (nothing to follow).

Batching: every iteration gathers the current work-list item of every active seed (up to ``batch_size`` seeds)
into one batch; the work lists are per-seed ring buffers inside one tensor, and finished seeds are replaced by
fresh ones at once, so the tensor work is always batched. Each candidate is evaluated once, with the
second-order pass: that one pass gives its FOL, its prediction and the ascent direction of its next step,
which is stored with it in the work list (2 second-order passes per popped item, against the reference code's
2 second-order and 2 first-order passes plus 2 extra predictions). The step factors ``u`` are drawn up front from the
seeded generator as one ``N x steps`` table indexed by (seed, step), so the result does not depend on
``batch_size`` or on the order in which seeds are scheduled: ``batch_size=1`` is the one-seed-at-a-time
version of the same algorithm.

Deviations from the reference code (stated, not silent): a candidate outside ``max_rel_l2`` (or outside the
optional L-inf ``eps``-ball, which steps are projected onto) is never recorded as a test, so every test
honours the stated bound; the seed filter uses the seed's label (``y`` when given, as the reference code
does, else the prediction); the budget is ``steps`` gradient steps (and optionally ``max_tests_per_seed``) per
seed plus an optional overall ``time_budget``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from robustest.core import reprs
from robustest.core.batching import checked_inputs
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError
from robustest.core.modelcall import eval_mode, forward, frozen_params
from robustest.core.progress import progress
from robustest.core.seeding import make_generator
from robustest.core.validation import check_eps

__all__ = ["FOL_VARIANTS", "FuzzResult", "fol_fuzz"]

#: How the FOL value recorded with each test is defined. ``"gradnorm"``: the reference code's L2 variant
#: ``||grad_x CE(f(x), c)||_2`` (``robustest.metrics.fol_gradnorm`` with the seed's predicted class ``c``);
#: ``"linf"``, ``"l2"``, ``"l1"``: the eps-ball FOL ``eps * ||g||_q - <x - x0, g>`` around the seed
#: (``robustest.metrics.fol(model, x, c, x0=seed, eps=fol_eps, norm=...)``).
FOL_VARIANTS = ("gradnorm", "linf", "l2", "l1")
_DUAL = {"linf": 1.0, "l2": 2.0, "l1": math.inf}


@dataclass
class FuzzResult:
    """Tests found by :func:`fol_fuzz`, ordered by (seed index, step).

    x: T x C x H x W tests in [0, 1]; y: int64 [T] label of each test's seed (the seed's ``y`` when given,
    else its predicted class); seed_index: int64 [T] position of the seed in the input; fol: [T] FOL of each
    test (definition in ``stats["fol_definition"]``); step: int64 [T] gradient step (1-based, counted per
    seed) at which the test was found; pred: int64 [T] the model's prediction on the test (differs from the
    seed's predicted class); stats: plain-data run statistics.
    """

    x: torch.Tensor
    y: torch.Tensor
    seed_index: torch.Tensor
    fol: torch.Tensor
    step: torch.Tensor
    stats: dict[str, Any] = field(default_factory=dict)
    pred: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __repr__(self) -> str:
        return reprs.one_line(self, tests=len(self), seeds=self.stats.get("seeds"),
                              seeds_with_tests=self.stats.get("seeds_with_tests"),
                              mean_fol=float(self.fol.float().mean()) if len(self) else None, x=reprs.shape(self.x),
                              seconds=self.stats.get("wall_time_s"))

    def tests_per_seed(self, num_seeds: int | None = None) -> torch.Tensor:
        """int64 [num_seeds]: how many tests each seed produced (``num_seeds`` defaults to the run's seeds)."""
        n = int(num_seeds if num_seeds is not None else self.stats.get("seeds", 0))
        return torch.bincount(self.seed_index.cpu(), minlength=n)


def _grad_eval(model: nn.Module, x: torch.Tensor, c: torch.Tensor, second: bool
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One forward pass at ``x`` (B x C x H x W) with labels ``c`` (B).

    Returns (logits B x K, g = grad_x CE B x C x H x W, FOL_L2 = ||g||_2 [B], d) where ``d`` is
    grad_x (FOL_L2 - p_c) (second-order, only when ``second``) else None. Samples are independent in eval
    mode, so the summed loss gives per-sample gradients.
    """
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = forward(model, x)
        loss = F.cross_entropy(logits, c, reduction="sum")
        (g,) = torch.autograd.grad(loss, x, create_graph=second)
        fol = torch.linalg.vector_norm(g.flatten(1), dim=1)
        d = None
        if second:
            p_c = logits.softmax(1).gather(1, c[:, None]).squeeze(1)
            (d,) = torch.autograd.grad((fol - p_c).sum(), x)
    return logits.detach(), g.detach(), fol.detach(), d


def _fol_value(variant: str, fol_l2: torch.Tensor, g: torch.Tensor, x: torch.Tensor, x0: torch.Tensor,
               eps: float) -> torch.Tensor:
    if variant == "gradnorm":
        return fol_l2
    gf = g.flatten(1)
    return eps * torch.linalg.vector_norm(gf, ord=_DUAL[variant], dim=1) - ((x - x0).flatten(1) * gf).sum(1)


def fol_fuzz(
    model: nn.Module,
    x: Any,
    y: torch.Tensor | None = None,
    steps: int = 40,
    lr: float = 0.1,
    max_rel_l2: float = 0.5,
    eps: float | None = None,
    max_tests_per_seed: int | None = None,
    time_budget: float | None = None,
    seed: int = 0,
    batch_size: int = 128,
    *,
    fol_variant: str = "gradnorm",
    fol_eps: float | None = None,
    grad_threshold: float = 1e-3,
    device: torch.device | str | None = None,
    show_progress: bool = False,
) -> FuzzResult:
    """FOL-guided fuzzing of ``model`` from the seeds ``x`` (N x C x H x W in [0, 1]), batched over seeds.

    Args:
        y: optional int64 [N] seed labels; tests carry their seed's label (the predicted class when None).
        steps: gradient steps per seed (rounded down to an even number: each popped work-list item gets 2).
        lr: step size; each step uses ``lr * u`` with ``u ~ U[0.5, 1.5)``.
        max_rel_l2: candidates must satisfy ``||x - x0||_2 / ||x0||_2 < max_rel_l2`` to join the work list
            or be recorded.
        eps: optional L-inf bound: every step is projected onto ``[x0 - eps, x0 + eps]``.
        max_tests_per_seed: a seed ends once it has produced this many tests (None: no limit).
        time_budget: stop after this many seconds (seeds not started by then are reported as such).
        seed: seeds the generator of the step factors; same seed, same tests.
        batch_size: how many seeds are fuzzed at once. Memory: the work lists hold
            ``2 * batch_size * (steps // 4 + 2)`` images (each item with its ascent direction; an item that
            could never be popped within the budget is not stored).
        fol_variant: FOL recorded with each test, one of :data:`FOL_VARIANTS` (the work-list criterion is
            always FOL_L2, as in the reference algorithm).
        fol_eps: eps of the eps-ball FOL variants (default: ``eps`` when given, else 0.3).
        grad_threshold: seeds with ``||grad_x CE||_2 <= grad_threshold`` are skipped.

    Returns:
        :class:`FuzzResult` with tensors on ``x``'s device.
    """
    t_start = time.perf_counter()
    x, y = checked_inputs(x, y)
    n = int(x.shape[0])
    if int(steps) < 2:
        raise ConfigError(f"steps must be >= 2 (each work-list item takes 2 gradient steps), got {steps}")
    if lr <= 0 or max_rel_l2 <= 0:
        raise ConfigError(f"lr and max_rel_l2 must be > 0, got lr={lr}, max_rel_l2={max_rel_l2}")
    eps = check_eps("eps", eps, allow_none=True)  # an optional L-inf bound
    if max_tests_per_seed is not None and max_tests_per_seed < 1:
        raise ConfigError(f"max_tests_per_seed must be >= 1 or None, got {max_tests_per_seed}")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if fol_variant not in FOL_VARIANTS:
        raise ConfigError(f"unknown fol_variant {fol_variant!r}: use one of {', '.join(FOL_VARIANTS)}")
    f_eps = float(fol_eps if fol_eps is not None else (eps if eps is not None else 0.3))
    fol_definition = ("fol_gradnorm: ||grad_x CE(f(x), c)||_2, c = predicted class of the seed"
                      if fol_variant == "gradnorm" else
                      f"fol: eps * ||g||_q - <x - x0, g>, norm={fol_variant}, eps={f_eps}, x0 = seed, "
                      "g = grad_x CE(f(x), c), c = predicted class of the seed")

    out_device = x.device
    dev = resolve_device(model, device)
    xs = x.detach().to(dev)
    dtype = xs.dtype
    max_iters = int(steps) // 2
    n_steps = 2 * max_iters
    q_cap = max_iters // 2 + 2  # work-list capacity: items beyond the remaining pops can never be popped
    cap = int(max_tests_per_seed) if max_tests_per_seed is not None else None
    gen = make_generator(seed, "cpu")
    u_table = (torch.rand(n, n_steps, generator=gen, dtype=torch.float64) + 0.5).to(dev, dtype)

    rec_x: list[torch.Tensor] = []
    rec_seed: list[torch.Tensor] = []
    rec_fol: list[torch.Tensor] = []
    rec_step: list[torch.Tensor] = []
    rec_pred: list[torch.Tensor] = []
    iterations = 0
    grad_steps = 0
    stopped = "completed"

    with eval_mode(model), frozen_params(model):
        # ---- pre-pass: predicted class of every seed and the seed filter
        c_all = torch.empty(n, dtype=torch.long, device=dev)
        keep = torch.zeros(n, dtype=torch.bool, device=dev)
        for s in range(0, n, max(batch_size, 256)):
            xb = xs[s:s + max(batch_size, 256)]
            with torch.no_grad():
                cb = forward(model, xb).argmax(1)
            lab = y[s:s + xb.shape[0]].to(dev) if y is not None else cb
            _, _, gn, _ = _grad_eval(model, xb, lab, second=False)
            c_all[s:s + xb.shape[0]] = cb
            keep[s:s + xb.shape[0]] = gn > grad_threshold
        pending = keep.nonzero().squeeze(1)
        n_pending = int(pending.numel())
        ptr = 0

        # ---- slot state (one slot per seed being fuzzed)
        b = max(1, min(batch_size, n_pending))
        shape = tuple(xs.shape[1:])
        sid = torch.full((b,), -1, dtype=torch.long, device=dev)
        head = torch.zeros(b, dtype=torch.long, device=dev)
        length = torch.zeros(b, dtype=torch.long, device=dev)
        iters = torch.zeros(b, dtype=torch.long, device=dev)
        nsteps = torch.zeros(b, dtype=torch.long, device=dev)
        ntests = torch.zeros(b, dtype=torch.long, device=dev)
        folmax = torch.zeros(b, dtype=dtype, device=dev)
        x0n = torch.ones(b, dtype=dtype, device=dev)
        c = torch.zeros(b, dtype=torch.long, device=dev)
        x0 = torch.zeros((b, *shape), dtype=dtype, device=dev)
        buf = torch.zeros((b, q_cap, *shape), dtype=dtype, device=dev)
        dbuf = torch.zeros((b, q_cap, *shape), dtype=dtype, device=dev)  # ascent direction of each item

        bar = progress(range(n_pending), enabled=show_progress, desc="fol-fuzz", unit="seed")
        bar_update = getattr(bar, "update", None)
        while True:
            free = (sid < 0).nonzero().squeeze(1)
            if free.numel() and ptr < n_pending:
                if time_budget is not None and time.perf_counter() - t_start > time_budget:
                    stopped = "time_budget"
                else:
                    k = min(int(free.numel()), n_pending - ptr)
                    s_new, new = free[:k], pending[ptr:ptr + k]
                    ptr += k
                    sid[s_new] = new
                    x0[s_new] = xs[new]
                    buf[s_new, 0] = xs[new]
                    dbuf[s_new, 0] = _grad_eval(model, xs[new], c_all[new], second=True)[3]
                    head[s_new] = 0
                    length[s_new] = 1
                    iters[s_new] = 0
                    nsteps[s_new] = 0
                    ntests[s_new] = 0
                    folmax[s_new] = 0
                    c[s_new] = c_all[new]
                    x0n[s_new] = torch.linalg.vector_norm(xs[new].flatten(1), dim=1).clamp_min(1e-12)
            act = (sid >= 0).nonzero().squeeze(1)
            if act.numel() == 0:
                break
            if time_budget is not None and time.perf_counter() - t_start > time_budget:
                stopped = "time_budget"
                break
            iterations += 1
            # pop the current item of every active seed
            pos = head[act] % q_cap
            cur, d = buf[act, pos], dbuf[act, pos]
            head[act] += 1
            length[act] -= 1
            iters[act] += 1
            ca, x0a, x0na, sida = c[act], x0[act], x0n[act], sid[act]
            for _ in range(2):
                u = u_table[sida, nsteps[act]]
                nsteps[act] += 1
                grad_steps += int(act.numel())
                xc = cur + (lr * u).view(-1, *([1] * len(shape))) * d
                if eps is not None:
                    xc = torch.minimum(torch.maximum(xc, x0a - eps), x0a + eps)
                xc = xc.clamp(0.0, 1.0)
                logits, g, fol2, d = _grad_eval(model, xc, ca, second=True)
                pred = logits.argmax(1)
                dist = torch.linalg.vector_norm((xc - x0a).flatten(1), dim=1) / x0na
                inside = dist < max_rel_l2
                accept = (fol2 > folmax[act]) & inside
                folmax[act] = torch.where(accept, fol2, folmax[act])
                store = accept & (length[act] < max_iters - iters[act])
                if bool(store.any()):
                    s_st = act[store]
                    pos = (head[s_st] + length[s_st]) % q_cap
                    buf[s_st, pos] = xc[store]
                    dbuf[s_st, pos] = d[store]
                    length[s_st] += 1
                rec = (pred != ca) & inside
                if cap is not None:
                    rec &= ntests[act] < cap
                if bool(rec.any()):
                    rec_x.append(xc[rec])
                    rec_seed.append(sida[rec])
                    rec_fol.append(_fol_value(fol_variant, fol2[rec], g[rec], xc[rec], x0a[rec], f_eps))
                    rec_step.append(nsteps[act][rec])
                    rec_pred.append(pred[rec])
                    ntests[act[rec]] += 1
                cur = xc
            done = (length[act] == 0) | (iters[act] >= max_iters)
            if cap is not None:
                done |= ntests[act] >= cap
            if bool(done.any()):
                sid[act[done]] = -1
                if bar_update is not None:
                    bar_update(int(done.sum()))
        if hasattr(bar, "close"):
            bar.close()

    if rec_x:
        tx, tseed, tfol = torch.cat(rec_x), torch.cat(rec_seed), torch.cat(rec_fol)
        tstep, tpred = torch.cat(rec_step), torch.cat(rec_pred)
        order = torch.argsort(tseed * (n_steps + 1) + tstep)
        tx, tseed, tfol, tstep, tpred = tx[order], tseed[order], tfol[order], tstep[order], tpred[order]
    else:
        tx = xs.new_zeros((0, *xs.shape[1:]))
        tseed = torch.zeros(0, dtype=torch.long, device=dev)
        tfol = xs.new_zeros(0)
        tstep = torch.zeros(0, dtype=torch.long, device=dev)
        tpred = torch.zeros(0, dtype=torch.long, device=dev)
    labels = y.to(dev)[tseed] if y is not None else c_all[tseed]

    n_skipped = n - n_pending
    tried = ptr
    per_seed = torch.bincount(tseed.cpu(), minlength=n)
    tried_mask = torch.zeros(n, dtype=torch.bool)
    tried_mask[pending[:tried].cpu()] = True
    stats: dict[str, Any] = {
        "seeds": n,
        "seeds_tried": tried,
        "seeds_skipped": n_skipped,
        "seeds_not_started": n_pending - tried,
        "seeds_with_tests": int((per_seed > 0).sum()),
        "tests": int(tx.shape[0]),
        "tests_per_seed": float(per_seed[tried_mask].float().mean()) if tried else 0.0,
        "tests_per_seed_max": int(per_seed.max()) if n else 0,
        "iterations": iterations,
        "gradient_steps": grad_steps,
        "wall_time_s": time.perf_counter() - t_start,
        "stopped": stopped,
        "fol_variant": fol_variant,
        "fol_definition": fol_definition,
        "params": {"steps": n_steps, "lr": lr, "max_rel_l2": max_rel_l2, "eps": eps,
                   "max_tests_per_seed": max_tests_per_seed, "time_budget": time_budget, "seed": seed,
                   "batch_size": batch_size, "grad_threshold": grad_threshold, "fol_eps": f_eps},
    }
    return FuzzResult(
        x=tx.to(out_device), y=labels.to(out_device), seed_index=tseed.to(out_device), fol=tfol.to(out_device),
        step=tstep.to(out_device), stats=stats, pred=tpred.to(out_device),
    )
