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
    opts = dict(metric_opts or {})
    out_device = x.device
    dev = resolve_device(model, device)
    xs, ys = x.detach().to(dev), y.to(dev)
    gen = make_generator(seed, "cpu")

    def predict(xb: torch.Tensor) -> torch.Tensor:
        outs = [forward(model, xb[s:s + 512]).argmax(1) for s in range(0, xb.shape[0], 512)]
        return torch.cat(outs) if outs else torch.zeros(0, dtype=torch.long, device=dev)

    rec_x: list[torch.Tensor] = []
    rec_y: list[torch.Tensor] = []
    rec_seed: list[torch.Tensor] = []
    rec_pred: list[torch.Tensor] = []
    rec_it: list[torch.Tensor] = []
    rec_op: list[torch.Tensor] = []
    n_generated = n_valid = n_queued = 0
    stopped = "iterations"

    with eval_mode(model), torch.no_grad():
        seed_pred = predict(xs)
        covered = profile.bits(xs, metric, **opts).any(0)
        n_cells = int(covered.numel())
        correct = (seed_pred == ys).nonzero().squeeze(1)
        queue = _Queue(xs[correct], correct, ys[correct])
        n_start = queue.n
        history: list[tuple[int, float, float]] = [(0, time.perf_counter() - t_start,
                                                    float(covered.sum()) / max(n_cells, 1))]
        cov_seeds = history[0][2]
        it = 0
        bar = progress(range(iterations or 0), enabled=show_progress and iterations is not None,
                       desc="cov-fuzz", unit="it")
        bar_update = getattr(bar, "update", None)
        while True:
            if iterations is not None and it >= iterations:
                break
            if time_budget is not None and time.perf_counter() - t_start > time_budget:
                stopped = "time_budget"
                break
            if queue.n == 0:
                stopped = "empty_queue"
                break
            it += 1
            # 1. seed selection (power schedule: weight 1 / (1 + picks))
            n_par = math.ceil(batch_size / mutants_per_seed)
            w = (1.0 / (1.0 + queue.picks[: queue.n].double())).cpu()
            par = torch.multinomial(w, n_par, replacement=queue.n < n_par, generator=gen).to(dev)
            queue.picks[par] += 1
            par = par.repeat_interleave(mutants_per_seed)[:batch_size]
            # 2. mutation
            mb = mutate(queue.x[par], gen, ref=queue.ref[par], affine_done=queue.aff[par], alpha=alpha, beta=beta,
                        tries=tries, ops=ops, ranges=ranges)
            n_generated += int(par.numel())
            vidx = mb.valid.nonzero().squeeze(1)
            n_valid += int(vidx.numel())
            if vidx.numel():
                xm = mb.x[vidx]
                lab = queue.y[par[vidx]]
                sd = queue.seed[par[vidx]]
                # 3. feedback
                pred = predict(xm)
                bits = profile.bits(xm, metric, **opts)
                fail = pred != lab
                new_cells = (bits & ~covered).any(1)
                covered |= bits.any(0)
                if bool(fail.any()):
                    rec_x.append(xm[fail])
                    rec_y.append(lab[fail])
                    rec_seed.append(sd[fail])
                    rec_pred.append(pred[fail])
                    rec_it.append(torch.full((int(fail.sum()),), it, dtype=torch.long, device=dev))
                    rec_op.append(mb.op[vidx][fail])
                keep = new_cells & ~fail
                if bool(keep.any()):
                    queue.add(xm[keep], mb.ref[vidx][keep], mb.affine_done[vidx][keep], sd[keep], lab[keep])
                    n_queued += int(keep.sum())
            history.append((it, time.perf_counter() - t_start, float(covered.sum()) / max(n_cells, 1)))
            if bar_update is not None:
                bar_update(1)
        if hasattr(bar, "close"):
            bar.close()

    if rec_x:
        tx, ty, tseed = torch.cat(rec_x), torch.cat(rec_y), torch.cat(rec_seed)
        tpred, tit, top = torch.cat(rec_pred), torch.cat(rec_it), torch.cat(rec_op)
    else:
        tx = xs.new_zeros((0, *xs.shape[1:]))
        ty, tseed, tpred, tit, top = (torch.zeros(0, dtype=torch.long, device=dev) for _ in range(5))
    stats: dict[str, Any] = {
        "seeds": n,
        "seeds_in_queue": int(correct.numel()),
        "iterations": it,
        "mutants_generated": n_generated,
        "mutants_valid": n_valid,
        "queue_added": n_queued,
        "queue_size": queue.n,
        "tests": int(tx.shape[0]),
        "seeds_with_tests": int(torch.unique(tseed).numel()),
        "coverage_seeds": cov_seeds,
        "coverage_final": history[-1][2],
        "cells": n_cells,
        "metric": metric,
        "metric_opts": opts,
        "wall_time_s": time.perf_counter() - t_start,
        "stopped": stopped,
        "ops": list(ops) if ops is not None else list(OPS),
        "params": {"iterations": iterations, "batch_size": batch_size, "time_budget": time_budget, "seed": seed,
                   "mutants_per_seed": mutants_per_seed, "tries": tries, "alpha": alpha, "beta": beta},
    }
    return CoverageFuzzResult(
        x=tx.to(out_device), y=ty.to(out_device), seed_index=tseed.to(out_device), coverage_history=history,
        stats=stats, pred=tpred.to(out_device), iteration=tit.to(out_device), op=top.to(out_device),
        corpus=queue.x[n_start:queue.n].to(out_device), corpus_seed_index=queue.seed[n_start:queue.n].to(out_device),
    )
