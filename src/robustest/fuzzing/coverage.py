"""Coverage-guided fuzzing in the style of DeepHunter (Xie et al., ISSTA 2019), batched.

The loop (one iteration):

1. **Seed selection.** Pick ``ceil(batch_size / mutants_per_seed)`` queue entries at random with weight
   ``1 / (1 + times_selected)`` (without replacement while the queue is large enough): a simple power schedule
   that favours entries fuzzed least often, like DeepHunter's probability-based selection.
2. **Mutation.** Each picked entry yields ``mutants_per_seed`` mutants from
   :func:`robustest.fuzzing.mutations.mutate` (affine at most once per lineage, then pixel-value only;
   DeepHunter's validity rule against the lineage's reference image; up to ``tries`` attempts each).
3. **Feedback.** One batched forward pass predicts every valid mutant and ``profile.bits`` says which
   coverage cells it covers. A valid mutant the model misclassifies (prediction != its seed's label) is a
   **failing test** (recorded, not queued, as DeepHunter keeps crashes out of the queue). A valid, correctly
   classified mutant that covers a cell not yet in the union (the union before this batch: the batch is
   judged as a whole) joins the queue. The union of covered cells (a BoolTensor) grows with every valid
   mutant.

The queue starts with the seeds the model classifies correctly (a misclassified seed is already a failure);
the starting union is that of all seeds, so ``coverage_history[0]`` is the coverage of the seeds alone.
All randomness comes from one generator seeded with ``seed``: with an iteration budget, runs reproduce
exactly. The budget is ``iterations`` and/or ``time_budget`` seconds, whichever ends first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from robustest.core import reprs
from robustest.core.batching import checked_inputs
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError
from robustest.core.modelcall import eval_mode, forward
from robustest.core.progress import progress
from robustest.core.seeding import make_generator
from robustest.fuzzing.mutations import OPS, mutate

__all__ = ["CoverageFuzzResult", "coverage_fuzz"]


@dataclass
class CoverageFuzzResult:
    """Failing tests found by :func:`coverage_fuzz` and the coverage reached over time.

    x: T x C x H x W failing tests in [0, 1]; y: int64 [T] label of each test's seed; seed_index: int64 [T]
    position of the original seed in the input; coverage_history: list of (iteration, seconds, coverage in
    [0, 1]) with iteration 0 = the seeds alone; stats: plain-data run statistics; pred: int64 [T] the model's
    prediction on each test; iteration: int64 [T] the iteration that found it; op: int64 [T] index into
    :data:`robustest.fuzzing.mutations.OPS` of the last mutation applied; corpus: the mutants that joined the
    queue (valid, correctly classified, new coverage) and corpus_seed_index their seeds, so that the seeds,
    the corpus and the failing tests together reach the final coverage.
    """

    x: torch.Tensor
    y: torch.Tensor
    seed_index: torch.Tensor
    coverage_history: list[tuple[int, float, float]]
    stats: dict[str, Any] = field(default_factory=dict)
    pred: torch.Tensor | None = None
    iteration: torch.Tensor | None = None
    op: torch.Tensor | None = None
    corpus: torch.Tensor | None = None
    corpus_seed_index: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __repr__(self) -> str:
        s = self.stats
        return reprs.one_line(self, tests=len(self), seeds=s.get("seeds"), metric=s.get("metric"),
                              coverage_seeds=s.get("coverage_seeds"), coverage_final=s.get("coverage_final"),
                              iterations=s.get("iterations"),
                              corpus=int(self.corpus.shape[0]) if self.corpus is not None else None,
                              x=reprs.shape(self.x), seconds=s.get("wall_time_s"))


class _Queue:
    """Growable tensor storage of queue entries (image, reference, affine state, seed, label, picks)."""

    def __init__(self, x: torch.Tensor, seed_index: torch.Tensor, y: torch.Tensor) -> None:
        n = x.shape[0]
        cap = max(16, 2 * n)
        self.n = 0
        self.x = x.new_empty((cap, *x.shape[1:]))
        self.ref = x.new_empty((cap, *x.shape[1:]))
        self.aff = torch.zeros(cap, dtype=torch.bool, device=x.device)
        self.seed = torch.zeros(cap, dtype=torch.long, device=x.device)
        self.y = torch.zeros(cap, dtype=torch.long, device=x.device)
        self.picks = torch.zeros(cap, dtype=torch.long, device=x.device)
        self.add(x, x, torch.zeros(n, dtype=torch.bool, device=x.device), seed_index, y)

    def _grow(self, need: int) -> None:
        cap = self.x.shape[0]
        if need <= cap:
            return
        new = max(need, 2 * cap)
        for name in ("x", "ref", "aff", "seed", "y", "picks"):
            old = getattr(self, name)
            t = old.new_zeros((new, *old.shape[1:]))
            t[: self.n] = old[: self.n]
            setattr(self, name, t)

    def add(self, x: torch.Tensor, ref: torch.Tensor, aff: torch.Tensor, seed: torch.Tensor, y: torch.Tensor) -> None:
        k = x.shape[0]
        self._grow(self.n + k)
        s = slice(self.n, self.n + k)
        self.x[s], self.ref[s], self.aff[s], self.seed[s], self.y[s] = x, ref, aff, seed, y
        self.picks[s] = 0
        self.n += k

    def pick(self, batch_size: int, mutants_per_seed: int, gen: torch.Generator) -> torch.Tensor:
        """int64 [batch_size]: queue entries to mutate, ``ceil(batch_size / mutants_per_seed)`` drawn with weight
        ``1 / (1 + picks)`` (the power schedule), each repeated ``mutants_per_seed`` times."""
        n_par = math.ceil(batch_size / mutants_per_seed)
        w = (1.0 / (1.0 + self.picks[: self.n].double())).cpu()
        par = torch.multinomial(w, n_par, replacement=self.n < n_par, generator=gen).to(self.x.device)
        self.picks[par] += 1
        return par.repeat_interleave(mutants_per_seed)[:batch_size]


@dataclass
class _Failures:
    """Failing tests recorded so far, one tensor per iteration that found any."""

    x: list[torch.Tensor] = field(default_factory=list)
    y: list[torch.Tensor] = field(default_factory=list)
    seed: list[torch.Tensor] = field(default_factory=list)
    pred: list[torch.Tensor] = field(default_factory=list)
    it: list[torch.Tensor] = field(default_factory=list)
    op: list[torch.Tensor] = field(default_factory=list)

    def tensors(self, xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(x T x C x H x W, y, seed, pred, iteration, op: int64 [T]) in the order found; empty like ``xs``."""
        if self.x:
            return (torch.cat(self.x), torch.cat(self.y), torch.cat(self.seed), torch.cat(self.pred),
                    torch.cat(self.it), torch.cat(self.op))
        return (xs.new_zeros((0, *xs.shape[1:])),
                *(torch.zeros(0, dtype=torch.long, device=xs.device) for _ in range(5)))


@dataclass
class _Counters:
    """Effort of a run: iterations done, mutants generated and valid, entries added to the queue."""

    it: int = 0
    generated: int = 0
    valid: int = 0
    queued: int = 0
    stopped: str = "iterations"


def _check_options(y: torch.Tensor | None, profile: Any, iterations: int | None, batch_size: int,
                   time_budget: float | None, mutants_per_seed: int) -> None:
    """Refuse bad options of :func:`coverage_fuzz` before any work."""
    if y is None:
        raise ConfigError("coverage_fuzz needs seed labels y: a mutant fails when the model disagrees with them")
    if iterations is None and time_budget is None:
        raise ConfigError("give a budget: iterations and/or time_budget (seconds)")
    if iterations is not None and iterations < 0:
        raise ConfigError(f"iterations must be >= 0, got {iterations}")
    if batch_size < 1 or mutants_per_seed < 1:
        raise ConfigError(f"batch_size and mutants_per_seed must be >= 1, got {batch_size}, {mutants_per_seed}")
    if not hasattr(profile, "bits"):
        raise ConfigError("profile must be a robustest.metrics.coverage.CoverageProfile (build one with "
                          "CoverageProfile.build(model, train))")


def _predict(model: nn.Module, xb: torch.Tensor) -> torch.Tensor:
    """int64 [B]: the model's predictions on ``xb`` (B x C x H x W), 512 images per forward pass."""
    outs = [forward(model, xb[s:s + 512]).argmax(1) for s in range(0, xb.shape[0], 512)]
    return torch.cat(outs) if outs else torch.zeros(0, dtype=torch.long, device=xb.device)


def _stop_reason(run: _Counters, queue: _Queue, iterations: int | None, time_budget: float | None,
                 t_start: float) -> str | None:
    """Why the run ends now (``"iterations"``, ``"time_budget"``, ``"empty_queue"``), or None to go on."""
    if iterations is not None and run.it >= iterations:
        return "iterations"
    if time_budget is not None and time.perf_counter() - t_start > time_budget:
        return "time_budget"
    if queue.n == 0:
        return "empty_queue"
    return None


@dataclass(frozen=True)
class _Setup:
    """What every iteration uses: the model and its coverage feedback, and how mutants are drawn."""

    model: nn.Module
    profile: Any
    metric: str
    opts: dict[str, Any]  # options of the metric
    batch_size: int
    mutants_per_seed: int
    mutate_kw: dict[str, Any]  # alpha, beta, tries, ops, ranges of mutate()


def _iteration(su: _Setup, queue: _Queue, covered: torch.Tensor, gen: torch.Generator, run: _Counters,
               found: _Failures) -> None:
    """One iteration (``run.it``): pick queue entries, mutate them, and judge the valid mutants against the
    union ``covered`` (bool [cells], grown in place): failures are recorded, new coverage joins the queue."""
    par = queue.pick(su.batch_size, su.mutants_per_seed, gen)
    mb = mutate(queue.x[par], gen, ref=queue.ref[par], affine_done=queue.aff[par], **su.mutate_kw)
    run.generated += int(par.numel())
    vidx = mb.valid.nonzero().squeeze(1)
    run.valid += int(vidx.numel())
    if not vidx.numel():
        return
    xm = mb.x[vidx]
    lab = queue.y[par[vidx]]
    sd = queue.seed[par[vidx]]
    pred = _predict(su.model, xm)
    bits = su.profile.bits(xm, su.metric, **su.opts)
    fail = pred != lab
    new_cells = (bits & ~covered).any(1)
    covered |= bits.any(0)
    if bool(fail.any()):
        found.x.append(xm[fail])
        found.y.append(lab[fail])
        found.seed.append(sd[fail])
        found.pred.append(pred[fail])
        found.it.append(torch.full((int(fail.sum()),), run.it, dtype=torch.long, device=xm.device))
        found.op.append(mb.op[vidx][fail])
    keep = new_cells & ~fail
    if bool(keep.any()):
        queue.add(xm[keep], mb.ref[vidx][keep], mb.affine_done[vidx][keep], sd[keep], lab[keep])
        run.queued += int(keep.sum())


def _start(su: _Setup, xs: torch.Tensor, ys: torch.Tensor, t_start: float
           ) -> tuple[torch.Tensor, torch.Tensor, _Queue, list[tuple[int, float, float]]]:
    """The state before the first iteration, from the seeds ``xs`` (N x C x H x W) and labels ``ys`` [N]:
    (union of the seeds' cells bool [cells], positions of the correctly classified seeds int64 [Q], the queue
    holding them, the coverage history with its entry for iteration 0)."""
    seed_pred = _predict(su.model, xs)
    covered = su.profile.bits(xs, su.metric, **su.opts).any(0)
    n_cells = int(covered.numel())
    correct = (seed_pred == ys).nonzero().squeeze(1)
    queue = _Queue(xs[correct], correct, ys[correct])
    history = [(0, time.perf_counter() - t_start, float(covered.sum()) / max(n_cells, 1))]
    return covered, correct, queue, history


def _fuzz(su: _Setup, queue: _Queue, covered: torch.Tensor, gen: torch.Generator, iterations: int | None,
          time_budget: float | None, t_start: float, show_progress: bool, history: list[tuple[int, float, float]]
          ) -> tuple[_Failures, _Counters]:
    """Iterate until the budget is spent or the queue is empty, appending (iteration, seconds, coverage) to
    ``history`` after each iteration."""
    found, run = _Failures(), _Counters()
    n_cells = int(covered.numel())
    bar = progress(range(iterations or 0), enabled=show_progress and iterations is not None,
                   desc="cov-fuzz", unit="it")
    bar_update = getattr(bar, "update", None)
    while (stop := _stop_reason(run, queue, iterations, time_budget, t_start)) is None:
        run.it += 1
        _iteration(su, queue, covered, gen, run, found)
        history.append((run.it, time.perf_counter() - t_start, float(covered.sum()) / max(n_cells, 1)))
        if bar_update is not None:
            bar_update(1)
    run.stopped = stop
    if hasattr(bar, "close"):
        bar.close()
    return found, run


def _run_stats(n: int, correct: torch.Tensor, queue: _Queue, run: _Counters, tseed: torch.Tensor, n_tests: int
               ) -> dict[str, Any]:
    """The seed, effort and test counts of a run's statistics."""
    return {
        "seeds": n,
        "seeds_in_queue": int(correct.numel()),
        "iterations": run.it,
        "mutants_generated": run.generated,
        "mutants_valid": run.valid,
        "queue_added": run.queued,
        "queue_size": queue.n,
        "tests": n_tests,
        "seeds_with_tests": int(torch.unique(tseed).numel()),
    }


def coverage_fuzz(
    model: nn.Module,
    x: Any,
    y: torch.Tensor | None,
    profile: Any,
    metric: str = "kmnc",
    iterations: int | None = 100,
    batch_size: int = 64,
    time_budget: float | None = None,
    seed: int = 0,
    *,
    metric_opts: dict[str, Any] | None = None,
    mutants_per_seed: int = 4,
    tries: int = 3,
    alpha: float = 0.02,
    beta: float = 0.2,
    ops: Sequence[str] | None = None,
    ranges: dict[str, tuple[float, float]] | None = None,
    device: torch.device | str | None = None,
    show_progress: bool = False,
) -> CoverageFuzzResult:
    """DeepHunter-style coverage-guided fuzzing of ``model`` from seeds ``x`` (N x C x H x W in [0, 1]).

    Args:
        y: int64 [N] seed labels (a mutant fails when the model's prediction differs from its seed's label).
        profile: a :class:`robustest.metrics.coverage.CoverageProfile` of ``model`` (``profile.bits(x, metric,
            **metric_opts)`` gives the cells each input covers).
        metric: coverage metric for the feedback (``"kmnc"``, ``"nc"``, ``"nbc"``, ``"snac"``, ``"tknc"``).
        iterations: iteration budget (None: only ``time_budget`` bounds the run).
        batch_size: mutants generated per iteration.
        time_budget: stop after this many seconds.
        seed: seeds the generator; same seed and iteration budget, same tests.
        metric_opts: options of the metric (e.g. ``{"k": 10}`` for KMNC).
        mutants_per_seed: mutants drawn from each picked queue entry.
        tries, alpha, beta, ops, ranges: passed to :func:`robustest.fuzzing.mutations.mutate`.

    Returns:
        :class:`CoverageFuzzResult` with tensors on ``x``'s device.
    """
    t_start = time.perf_counter()
    x, y = checked_inputs(x, y)
    n = int(x.shape[0])
    _check_options(y, profile, iterations, batch_size, time_budget, mutants_per_seed)
    opts = dict(metric_opts or {})
    out_device = x.device
    dev = resolve_device(model, device)
    xs, ys = x.detach().to(dev), y.to(dev)
    gen = make_generator(seed, "cpu")
    su = _Setup(model=model, profile=profile, metric=metric, opts=opts, batch_size=batch_size,
                mutants_per_seed=mutants_per_seed,
                mutate_kw={"alpha": alpha, "beta": beta, "tries": tries, "ops": ops, "ranges": ranges})

    with eval_mode(model), torch.no_grad():
        covered, correct, queue, history = _start(su, xs, ys, t_start)
        n_start = queue.n
        found, run = _fuzz(su, queue, covered, gen, iterations, time_budget, t_start, show_progress, history)

    tx, ty, tseed, tpred, tit, top = found.tensors(xs)
    stats: dict[str, Any] = {
        **_run_stats(n, correct, queue, run, tseed, int(tx.shape[0])),
        "coverage_seeds": history[0][2],
        "coverage_final": history[-1][2],
        "cells": int(covered.numel()),
        "metric": metric,
        "metric_opts": opts,
        "wall_time_s": time.perf_counter() - t_start,
        "stopped": run.stopped,
        "ops": list(ops) if ops is not None else list(OPS),
        "params": {"iterations": iterations, "batch_size": batch_size, "time_budget": time_budget, "seed": seed,
                   "mutants_per_seed": mutants_per_seed, "tries": tries, "alpha": alpha, "beta": beta},
    }
    return CoverageFuzzResult(
        x=tx.to(out_device), y=ty.to(out_device), seed_index=tseed.to(out_device), coverage_history=history,
        stats=stats, pred=tpred.to(out_device), iteration=tit.to(out_device), op=top.to(out_device),
        corpus=queue.x[n_start:queue.n].to(out_device), corpus_seed_index=queue.seed[n_start:queue.n].to(out_device),
    )
