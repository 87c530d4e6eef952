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


@dataclass(frozen=True)
class _Settings:
    """The options one gradient step needs, resolved from :func:`fol_fuzz`'s arguments."""

    lr: float
    max_rel_l2: float
    eps: float | None  # optional L-inf bound around the seed
    max_iters: int  # work-list items popped per seed at most (2 gradient steps each)
    cap: int | None  # max_tests_per_seed
    fol_variant: str
    fol_eps: float


@dataclass
class _WorkLists:
    """The fuzzing queue: one slot per seed being fuzzed (B slots), each with a ring buffer of Q items.

    sid: int64 [B] seed index of each slot (-1: free); head, length: int64 [B] ring-buffer start and fill;
    iters, nsteps, ntests: int64 [B] items popped, gradient steps taken and tests recorded for the slot's seed;
    folmax: [B] best FOL_L2 seen; x0n: [B] ||x0||_2 (clamped); c: int64 [B] the seed's class; x0: B x C x H x W
    the seeds; buf, dbuf: B x Q x C x H x W the queued items and the ascent direction stored with each.
    """

    sid: torch.Tensor
    head: torch.Tensor
    length: torch.Tensor
    iters: torch.Tensor
    nsteps: torch.Tensor
    ntests: torch.Tensor
    folmax: torch.Tensor
    x0n: torch.Tensor
    c: torch.Tensor
    x0: torch.Tensor
    buf: torch.Tensor
    dbuf: torch.Tensor

    @classmethod
    def empty(cls, b: int, q_cap: int, shape: tuple[int, ...], dtype: torch.dtype, dev: torch.device
              ) -> _WorkLists:
        """``b`` free slots for images of ``shape`` (C, H, W), each with room for ``q_cap`` items."""
        def longs() -> torch.Tensor:
            return torch.zeros(b, dtype=torch.long, device=dev)

        return cls(
            sid=torch.full((b,), -1, dtype=torch.long, device=dev), head=longs(), length=longs(), iters=longs(),
            nsteps=longs(), ntests=longs(), folmax=torch.zeros(b, dtype=dtype, device=dev),
            x0n=torch.ones(b, dtype=dtype, device=dev), c=longs(), x0=torch.zeros((b, *shape), dtype=dtype, device=dev),
            buf=torch.zeros((b, q_cap, *shape), dtype=dtype, device=dev),
            dbuf=torch.zeros((b, q_cap, *shape), dtype=dtype, device=dev),
        )

    @property
    def q_cap(self) -> int:
        return int(self.buf.shape[1])

    def start(self, slots: torch.Tensor, new: torch.Tensor, x_new: torch.Tensor, c_new: torch.Tensor,
              d_new: torch.Tensor) -> None:
        """Put the seeds ``new`` (int64 [K], images K x C x H x W, classes [K], ascent directions) in ``slots``."""
        self.sid[slots] = new
        self.x0[slots] = x_new
        self.buf[slots, 0] = x_new
        self.dbuf[slots, 0] = d_new
        self.head[slots] = 0
        self.length[slots] = 1
        self.iters[slots] = 0
        self.nsteps[slots] = 0
        self.ntests[slots] = 0
        self.folmax[slots] = 0
        self.c[slots] = c_new
        self.x0n[slots] = torch.linalg.vector_norm(x_new.flatten(1), dim=1).clamp_min(1e-12)

    def pop(self, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(item, its ascent direction), each A x C x H x W: the current item of every active slot in ``act``."""
        pos = self.head[act] % self.q_cap
        cur, d = self.buf[act, pos], self.dbuf[act, pos]
        self.head[act] += 1
        self.length[act] -= 1
        self.iters[act] += 1
        return cur, d

    def push(self, slots: torch.Tensor, x: torch.Tensor, d: torch.Tensor) -> None:
        """Append the items ``x`` (with ascent directions ``d``) to the work lists of ``slots``."""
        pos = (self.head[slots] + self.length[slots]) % self.q_cap
        self.buf[slots, pos] = x
        self.dbuf[slots, pos] = d
        self.length[slots] += 1


@dataclass
class _Found:
    """Tests recorded so far, one tensor per gradient step that found any."""

    x: list[torch.Tensor] = field(default_factory=list)
    seed: list[torch.Tensor] = field(default_factory=list)
    fol: list[torch.Tensor] = field(default_factory=list)
    step: list[torch.Tensor] = field(default_factory=list)
    pred: list[torch.Tensor] = field(default_factory=list)

    def tensors(self, xs: torch.Tensor, n_steps: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x T x C x H x W, seed [T], fol [T], step [T], pred [T]) ordered by (seed, step); empty like ``xs``."""
        if not self.x:
            long0 = torch.zeros(0, dtype=torch.long, device=xs.device)
            return xs.new_zeros((0, *xs.shape[1:])), long0, xs.new_zeros(0), long0.clone(), long0.clone()
        tx, tseed, tfol = torch.cat(self.x), torch.cat(self.seed), torch.cat(self.fol)
        tstep, tpred = torch.cat(self.step), torch.cat(self.pred)
        order = torch.argsort(tseed * (n_steps + 1) + tstep)
        return tx[order], tseed[order], tfol[order], tstep[order], tpred[order]


@dataclass
class _Counters:
    """How far the run got: seeds started (``ptr`` into the pending seeds), iterations, gradient steps."""

    ptr: int = 0
    iterations: int = 0
    grad_steps: int = 0
    stopped: str = "completed"


def _out_of_time(t_start: float, time_budget: float | None) -> bool:
    return time_budget is not None and time.perf_counter() - t_start > time_budget


def _check_options(steps: int, lr: float, max_rel_l2: float, eps: float | None, max_tests_per_seed: int | None,
                   batch_size: int, fol_variant: str) -> float | None:
    """Refuse bad options of :func:`fol_fuzz` before any work; returns the checked ``eps``."""
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
    return eps


def _fol_definition(fol_variant: str, f_eps: float) -> str:
    return ("fol_gradnorm: ||grad_x CE(f(x), c)||_2, c = predicted class of the seed"
            if fol_variant == "gradnorm" else
            f"fol: eps * ||g||_q - <x - x0, g>, norm={fol_variant}, eps={f_eps}, x0 = seed, "
            "g = grad_x CE(f(x), c), c = predicted class of the seed")


def _seed_filter(model: nn.Module, xs: torch.Tensor, y: torch.Tensor | None, batch_size: int,
                 grad_threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(predicted class int64 [N], keep bool [N]) of the seeds ``xs`` (N x C x H x W): a seed is kept when
    the loss gradient of its label (``y`` when given, else the prediction) has L2 norm above ``grad_threshold``."""
    n = int(xs.shape[0])
    dev = xs.device
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
    return c_all, keep


def _refill(model: nn.Module, wl: _WorkLists, xs: torch.Tensor, c_all: torch.Tensor, pending: torch.Tensor,
            run: _Counters, t_start: float, time_budget: float | None) -> None:
    """Start the next pending seeds in the free slots (none once the time budget is spent)."""
    free = (wl.sid < 0).nonzero().squeeze(1)
    n_pending = int(pending.numel())
    if not (free.numel() and run.ptr < n_pending):
        return
    if _out_of_time(t_start, time_budget):
        run.stopped = "time_budget"
        return
    k = min(int(free.numel()), n_pending - run.ptr)
    s_new, new = free[:k], pending[run.ptr:run.ptr + k]
    run.ptr += k
    d_new = _grad_eval(model, xs[new], c_all[new], second=True)[3]
    wl.start(s_new, new, xs[new], c_all[new], d_new)


def _iteration(model: nn.Module, wl: _WorkLists, act: torch.Tensor, u_table: torch.Tensor, opt: _Settings,
               found: _Found) -> int:
    """Pop the current item of every active slot in ``act`` (int64 [A]) and take its 2 gradient steps;
    candidates join the work lists or are recorded as tests. Returns the gradient steps taken."""
    cur, d = wl.pop(act)
    ca, x0a, x0na, sida = wl.c[act], wl.x0[act], wl.x0n[act], wl.sid[act]
    n_dims = cur.dim() - 1
    grad_steps = 0
    for _ in range(2):
        u = u_table[sida, wl.nsteps[act]]
        wl.nsteps[act] += 1
        grad_steps += int(act.numel())
        xc = cur + (opt.lr * u).view(-1, *([1] * n_dims)) * d
        if opt.eps is not None:
            xc = torch.minimum(torch.maximum(xc, x0a - opt.eps), x0a + opt.eps)
        xc = xc.clamp(0.0, 1.0)
        logits, g, fol2, d = _grad_eval(model, xc, ca, second=True)
        pred = logits.argmax(1)
        dist = torch.linalg.vector_norm((xc - x0a).flatten(1), dim=1) / x0na
        inside = dist < opt.max_rel_l2
        accept = (fol2 > wl.folmax[act]) & inside
        wl.folmax[act] = torch.where(accept, fol2, wl.folmax[act])
        store = accept & (wl.length[act] < opt.max_iters - wl.iters[act])
        if bool(store.any()):
            wl.push(act[store], xc[store], d[store])
        rec = (pred != ca) & inside
        if opt.cap is not None:
            rec &= wl.ntests[act] < opt.cap
        if bool(rec.any()):
            found.x.append(xc[rec])
            found.seed.append(sida[rec])
            found.fol.append(_fol_value(opt.fol_variant, fol2[rec], g[rec], xc[rec], x0a[rec], opt.fol_eps))
            found.step.append(wl.nsteps[act][rec])
            found.pred.append(pred[rec])
            wl.ntests[act[rec]] += 1
        cur = xc
    return grad_steps


def _finish_seeds(wl: _WorkLists, act: torch.Tensor, opt: _Settings) -> int:
    """Free the slots in ``act`` whose seed is done (work list empty, items or tests used up); returns how many."""
    done = (wl.length[act] == 0) | (wl.iters[act] >= opt.max_iters)
    if opt.cap is not None:
        done |= wl.ntests[act] >= opt.cap
    if not bool(done.any()):
        return 0
    wl.sid[act[done]] = -1
    return int(done.sum())


def _fuzz(model: nn.Module, xs: torch.Tensor, c_all: torch.Tensor, pending: torch.Tensor, batch_size: int,
          u_table: torch.Tensor, opt: _Settings, t_start: float, time_budget: float | None, show_progress: bool
          ) -> tuple[_Found, _Counters]:
    """Fuzz the ``pending`` seeds (int64 [P] positions in ``xs``), up to ``batch_size`` at a time."""
    n_pending = int(pending.numel())
    b = max(1, min(batch_size, n_pending))
    wl = _WorkLists.empty(b, opt.max_iters // 2 + 2,  # items beyond the remaining pops can never be popped
                          tuple(xs.shape[1:]), xs.dtype, xs.device)
    found, run = _Found(), _Counters()
    bar = progress(range(n_pending), enabled=show_progress, desc="fol-fuzz", unit="seed")
    bar_update = getattr(bar, "update", None)
    while True:
        _refill(model, wl, xs, c_all, pending, run, t_start, time_budget)
        act = (wl.sid >= 0).nonzero().squeeze(1)
        if act.numel() == 0:
            break
        if _out_of_time(t_start, time_budget):
            run.stopped = "time_budget"
            break
        run.iterations += 1
        run.grad_steps += _iteration(model, wl, act, u_table, opt, found)
        finished = _finish_seeds(wl, act, opt)
        if finished and bar_update is not None:
            bar_update(finished)
    if hasattr(bar, "close"):
        bar.close()
    return found, run


def _run_stats(n: int, pending: torch.Tensor, run: _Counters, tseed: torch.Tensor, n_tests: int, t_start: float
               ) -> dict[str, Any]:
    """The seed, test and effort counts of a run's statistics."""
    n_pending = int(pending.numel())
    tried = run.ptr
    per_seed = torch.bincount(tseed.cpu(), minlength=n)
    tried_mask = torch.zeros(n, dtype=torch.bool)
    tried_mask[pending[:tried].cpu()] = True
    return {
        "seeds": n,
        "seeds_tried": tried,
        "seeds_skipped": n - n_pending,
        "seeds_not_started": n_pending - tried,
        "seeds_with_tests": int((per_seed > 0).sum()),
        "tests": n_tests,
        "tests_per_seed": float(per_seed[tried_mask].float().mean()) if tried else 0.0,
        "tests_per_seed_max": int(per_seed.max()) if n else 0,
        "iterations": run.iterations,
        "gradient_steps": run.grad_steps,
        "wall_time_s": time.perf_counter() - t_start,
        "stopped": run.stopped,
    }


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
    eps = _check_options(steps, lr, max_rel_l2, eps, max_tests_per_seed, batch_size, fol_variant)
    f_eps = float(fol_eps if fol_eps is not None else (eps if eps is not None else 0.3))
    out_device = x.device
    dev = resolve_device(model, device)
    xs = x.detach().to(dev)
    max_iters = int(steps) // 2
    n_steps = 2 * max_iters
    opt = _Settings(lr=lr, max_rel_l2=max_rel_l2, eps=eps, max_iters=max_iters,
                    cap=int(max_tests_per_seed) if max_tests_per_seed is not None else None,
                    fol_variant=fol_variant, fol_eps=f_eps)
    gen = make_generator(seed, "cpu")
    u_table = (torch.rand(n, n_steps, generator=gen, dtype=torch.float64) + 0.5).to(dev, xs.dtype)

    with eval_mode(model), frozen_params(model):
        c_all, keep = _seed_filter(model, xs, y, batch_size, grad_threshold)
        pending = keep.nonzero().squeeze(1)
        found, run = _fuzz(model, xs, c_all, pending, batch_size, u_table, opt, t_start, time_budget,
                           show_progress)

    tx, tseed, tfol, tstep, tpred = found.tensors(xs, n_steps)
    labels = y.to(dev)[tseed] if y is not None else c_all[tseed]
    stats: dict[str, Any] = {
        **_run_stats(n, pending, run, tseed, int(tx.shape[0]), t_start),
        "fol_variant": fol_variant,
        "fol_definition": _fol_definition(fol_variant, f_eps),
        "params": {"steps": n_steps, "lr": lr, "max_rel_l2": max_rel_l2, "eps": eps,
                   "max_tests_per_seed": max_tests_per_seed, "time_budget": time_budget, "seed": seed,
                   "batch_size": batch_size, "grad_threshold": grad_threshold, "fol_eps": f_eps},
    }
    return FuzzResult(
        x=tx.to(out_device), y=labels.to(out_device), seed_index=tseed.to(out_device), fol=tfol.to(out_device),
        step=tstep.to(out_device), stats=stats, pred=tpred.to(out_device),
    )
