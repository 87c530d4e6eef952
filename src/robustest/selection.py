"""Test selection: pick ``n`` inputs from a scored pool.

``select(scores, n, strategy, *, k=4, seed=0)`` returns int64 indices into the pool (CPU tensor, all
distinct, exactly ``min(n, N)`` of them). Strategies:

* ``best`` (RobOT BE-ST): the ``n // 2`` lowest and the ``n - n // 2`` highest scores. Order: lowest first
  (ascending), then highest (descending).
* ``kmst`` (RobOT KM-ST): the score range ``[min, max]`` is split into ``k`` equal-width sections; each
  non-empty section gets an equal share of ``n`` drawn uniformly at random from it. Sections holding fewer
  inputs than their share give all they have and the shortfall is spread evenly over the others (water
  filling), so exactly ``n`` distinct inputs come back even for skewed or constant scores. Leftover units
  of an uneven split go to randomly chosen sections (seeded). Order: section by section, random within.
* ``top`` / ``bottom``: the ``n`` highest / lowest scores in rank order (ties: lower index first). Use
  ``top`` for DeepGini, entropy, LSA/DSA, FOL; ``bottom`` for margin or max probability.
* ``random``: ``n`` inputs uniformly at random (seeded).
* ``stratified``: stratified random sampling. The pool is cut into ``k`` equal-frequency score bins (score
  quantiles; ties split by index) and, when ``labels`` are given, crossed with the class: ``k x C`` strata.
  Each stratum gets its proportional share ``n * size / N`` (rounded down; the leftover units go to the
  strata with the largest fractional parts, ties broken at random), drawn uniformly at random inside it. It
  is random selection with the variance over the score range and the classes taken out: a random draw of a
  small budget can miss a class or over-sample one end of the FOL range, this one cannot. Order: stratum by
  stratum, random within.
* ``fol-prop``: weighted sampling without replacement with probability proportional to the score (e.g. FOL;
  scores must be >= 0), by the exponential-key method of Efraimidis and Spirakis (2006): each input draws
  ``u ~ U(0, 1)`` and the ``n`` largest keys ``log(u) / score`` win, in one sort. Inputs of score 0 come
  last, in random order, and only when fewer than ``n`` inputs have a positive score. Order: draw order.
* ``coverage``: greedy additional coverage. ``scores`` is a ``BoolTensor[N, F]`` saying which coverage cells
  (e.g. KMNC sections, NC neurons; :meth:`robustest.metrics.coverage.CoverageProfile.bits`) each input
  covers. Each step picks the input that covers the most cells not yet covered (ties: lower index). Once no
  input adds coverage, the rest is filled by ``fill``: ``"total"`` (default; most cells covered, ties lower
  index) or ``"random"`` (seeded).
* ``kcenter``: k-center greedy (the core-set selection of Sener and Savarese, 2018). ``scores`` is a float
  ``[N, D]`` tensor of features (e.g. penultimate-layer activations). The first centre is drawn uniformly
  at random (seeded); each further step picks the input farthest (Euclidean) from its nearest chosen centre
  (ties: lower index), so the selection covers the feature space with the smallest radius the greedy rule
  finds (within twice the optimal radius). One ``[N, D]`` distance update per pick on the features' device;
  duplicates are picked only once every distinct point is taken. Order: pick order.

Errors are :class:`robustest.core.errors.ConfigError` with a one-line message; ``n`` larger than the pool returns
the whole pool with a :class:`UserWarning`.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from robustest.core.errors import ConfigError

__all__ = ["STRATEGIES", "describe", "names", "quantile_bins", "sections", "select"]

STRATEGIES: dict[str, str] = {
    "best": "BE-ST: n//2 lowest and n - n//2 highest scores (RobOT)",
    "kmst": "KM-ST: k equal-width sections of the score range, an equal random share from each (RobOT)",
    "top": "the n highest scores (e.g. DeepGini's most uncertain first)",
    "bottom": "the n lowest scores (e.g. smallest margin first)",
    "random": "n inputs uniformly at random",
    "coverage": "greedy additional coverage over a BoolTensor[N, F] of covered cells",
    "stratified": "stratified random: k score-quantile bins (x class with labels), proportional shares",
    "fol-prop": "n inputs drawn without replacement with probability proportional to the score (>= 0)",
    "kcenter": "k-center greedy (core-set) over a float [N, D] of features: each pick the farthest from the chosen",
}

FILLS = ("total", "random")


def names() -> list[str]:
    """Names of the selection strategies."""
    return list(STRATEGIES)


def describe(name: str) -> str:
    """One line describing strategy ``name``."""
    if name not in STRATEGIES:
        raise ConfigError(f"unknown selection strategy {name!r}: choose one of {', '.join(STRATEGIES)}")
    return f"{name}: {STRATEGIES[name]}"


# ------------------------------------------------------------------------------------------ validation
def _as_tensor(scores: Any) -> torch.Tensor:
    if isinstance(scores, torch.Tensor):
        return scores.detach().cpu()
    try:
        return torch.as_tensor(np.asarray(scores))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"scores must be a tensor or array of numbers, got {type(scores).__name__}") from exc


def _check_scores(scores: Any) -> torch.Tensor:
    s = _as_tensor(scores)
    if s.dim() != 1:
        raise ConfigError(f"scores must be a 1-D tensor [N] (one score per input), got shape {tuple(s.shape)}")
    if s.dtype == torch.bool or s.is_complex():
        raise ConfigError(f"scores must be real numbers, got dtype {s.dtype}")
    s = s.to(torch.float64)
    if bool(torch.isnan(s).any()):
        raise ConfigError(f"scores contain {int(torch.isnan(s).sum())} NaN values: drop or recompute them first")
    if bool(torch.isinf(s).any()):
        raise ConfigError("scores contain infinite values: clip or drop them first")
    return s


def _check_bits(bits: Any) -> torch.Tensor:
    b = _as_tensor(bits)
    if b.dim() != 2:
        raise ConfigError(
            f"strategy 'coverage' needs a BoolTensor [N, F] of covered cells (profile.bits), got shape {tuple(b.shape)}"
        )
    if b.dtype != torch.bool:
        if b.is_floating_point() and bool(torch.isnan(b).any()):
            raise ConfigError("coverage cells contain NaN: pass a BoolTensor [N, F] from profile.bits")
        if not bool(((b == 0) | (b == 1)).all()):
            raise ConfigError("strategy 'coverage' needs 0/1 (boolean) coverage cells [N, F], got other values")
        b = b.bool()
    return b


def _check_features(feats: Any) -> torch.Tensor:
    f = feats.detach() if isinstance(feats, torch.Tensor) else _as_tensor(feats)  # keeps the features' device
    if f.dim() != 2:
        raise ConfigError(f"strategy 'kcenter' needs a float tensor [N, D] of features (e.g. penultimate-layer "
                          f"activations), got shape {tuple(f.shape)}")
    if f.dtype == torch.bool or f.is_complex():
        raise ConfigError(f"kcenter features must be real numbers, got dtype {f.dtype}")
    f = f.float() if not f.is_floating_point() or f.dtype in (torch.float16, torch.bfloat16) else f
    if not bool(torch.isfinite(f).all()):
        raise ConfigError("kcenter features contain NaN or infinite values: recompute them (is the model diverged?)")
    return f


def _check_n(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ConfigError(f"n must be a non-negative integer, got {n!r}")
    n = int(n)
    if n < 0:
        raise ConfigError(f"n must be >= 0, got {n}")
    return n


# ------------------------------------------------------------------------------------------- strategies
def sections(scores: torch.Tensor, k: int) -> torch.Tensor:
    """KM-ST section of each score ``[N]`` -> int64 ``[N]`` in ``[0, k)``.

    Sections are ``k`` equal-width bins of ``[min, max]`` (the maximum falls in the last one); constant
    scores all fall in section 0.
    """
    s = _check_scores(scores)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"k must be a positive integer, got {k!r}")
    if s.numel() == 0:
        return torch.zeros(0, dtype=torch.int64)
    lo, hi = s.min(), s.max()
    if not bool(hi > lo):
        return torch.zeros(s.shape[0], dtype=torch.int64)
    sec = torch.floor((s - lo) / (hi - lo) * int(k)).to(torch.int64)
    return sec.clamp_(0, int(k) - 1)


def _water_fill(counts: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """Split ``n`` (<= counts.sum()) over sections as evenly as their ``counts`` allow."""
    alloc = torch.zeros_like(counts)
    remaining = n
    while remaining > 0:
        room = counts - alloc
        open_ = torch.nonzero(room > 0).flatten()
        share = remaining // len(open_)
        if share > 0:
            add = torch.minimum(room[open_], torch.tensor(share))
            alloc[open_] += add
            remaining -= int(add.sum())
        else:  # fewer units than open sections: one each to randomly chosen sections
            pick = open_[torch.randperm(len(open_), generator=gen)[:remaining]]
            alloc[pick] += 1
            remaining = 0
    return alloc


def _kmst(s: torch.Tensor, n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    sec = sections(s, k)
    counts = torch.bincount(sec, minlength=k)
    alloc = _water_fill(counts, n, gen)
    # random order within each section, vectorised: shuffle, then stable sort by section
    perm = torch.randperm(s.shape[0], generator=gen)
    order = perm[torch.sort(sec[perm], stable=True).indices]
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(s.shape[0]) - starts[sec[order]]
    return order[rank < alloc[sec[order]]]


def quantile_bins(scores: Any, k: int) -> torch.Tensor:
    """Equal-frequency bin of each score ``[N]`` -> int64 ``[N]`` in ``[0, min(k, N))``: the scores in rank order
    (ties: lower index first) are cut into ``k`` runs of (nearly) equal length, bin 0 the lowest."""
    s = _check_scores(scores)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"k must be a positive integer, got {k!r}")
    num = s.shape[0]
    out = torch.empty(num, dtype=torch.int64)
    out[torch.sort(s, stable=True).indices] = torch.arange(num) * int(k) // max(num, 1)
    return out


def _check_labels(labels: Any, num: int) -> torch.Tensor:
    lab = _as_tensor(labels)
    if lab.dim() != 1 or lab.shape[0] != num:
        raise ConfigError(f"labels must be a 1-D tensor with one label per score ({num}), got shape "
                          f"{tuple(lab.shape)}")
    if lab.is_floating_point() or lab.dtype == torch.bool or lab.is_complex():
        raise ConfigError(f"labels must be integer class indices, got dtype {lab.dtype}")
    return lab.to(torch.int64)


def _stratified(s: torch.Tensor, n: int, k: int, labels: torch.Tensor | None, gen: torch.Generator) -> torch.Tensor:
    num = s.shape[0]
    strata = quantile_bins(s, k)
    if labels is not None:
        cls = torch.unique(labels, return_inverse=True)[1]
        strata = cls * int(k) + strata
    strata = torch.unique(strata, return_inverse=True)[1]  # dense ids 0..S-1
    counts = torch.bincount(strata)
    quota = counts.to(torch.float64) * n / num
    alloc = torch.floor(quota).to(torch.int64)
    rest = n - int(alloc.sum())
    if rest > 0:  # largest remainders, ties at random: sort by (fraction desc, random key)
        frac = quota - alloc
        shuffled = torch.randperm(len(counts), generator=gen)
        order = shuffled[torch.sort(frac[shuffled], descending=True, stable=True).indices]
        alloc[order[:rest]] += 1
    perm = torch.randperm(num, generator=gen)
    order = perm[torch.sort(strata[perm], stable=True).indices]
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(num) - starts[strata[order]]
    return order[rank < alloc[strata[order]]]


def _proportional(s: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    if bool((s < 0).any()):
        raise ConfigError(f"strategy 'fol-prop' samples with probability proportional to the score, which must be "
                          f">= 0; got a minimum of {float(s.min()):.4g} (use FOL, DeepGini or another non-negative "
                          "score)")
    u = torch.rand(s.shape[0], generator=gen, dtype=torch.float64).clamp_min_(1e-300)
    pos = torch.nonzero(s > 0).flatten()
    keys = torch.log(u[pos]) / s[pos]
    first = pos[torch.sort(keys, descending=True, stable=True).indices[:n]]
    if first.numel() >= n:
        return first
    zero = torch.nonzero(s <= 0).flatten()
    return torch.cat([first, zero[torch.randperm(zero.numel(), generator=gen)[: n - first.numel()]]])


def _greedy_coverage(bits: torch.Tensor, n: int, fill: str, gen: torch.Generator) -> torch.Tensor:
    num = bits.shape[0]
    bf = bits.to(torch.float32)
    gains = bf.sum(dim=1)
    total = gains.clone()
    covered = torch.zeros(bits.shape[1], dtype=torch.bool)
    taken = torch.zeros(num, dtype=torch.bool)
    picked: list[int] = []
    while len(picked) < n:
        g = gains.masked_fill(taken, -1.0)
        i = int(torch.argmax(g))  # first maximum: ties go to the lower index
        if g[i] <= 0:
            break
        picked.append(i)
        taken[i] = True
        new = bits[i] & ~covered
        covered |= new
        # the cells input i adds are now covered: nobody gains them any more (O(N * new cells))
        gains -= bf[:, new].sum(dim=1)
    rest = n - len(picked)
    if rest > 0:
        left = torch.nonzero(~taken).flatten()
        if fill == "total":
            order = torch.sort(-total[left], stable=True).indices
        else:
            order = torch.randperm(len(left), generator=gen)
        picked.extend(left[order[:rest]].tolist())
    return torch.tensor(picked, dtype=torch.int64)


def _kcenter(f: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """k-center greedy on features ``f`` [N, D]: ``n`` distinct indices in pick order, on ``f``'s device."""
    f = f.to(torch.float64)  # ||a||^2 - 2<a, c> + ||c||^2 loses little in float64
    num = f.shape[0]
    sq = f.pow(2).sum(dim=1)
    first = int(torch.randint(num, (1,), generator=gen))
    picked = torch.empty(n, dtype=torch.int64, device=f.device)
    picked[0] = first
    # squared distance of every input to its nearest centre; -1 marks the centres themselves
    dist = (sq - 2 * (f @ f[first]) + sq[first]).clamp_min_(0)
    dist[first] = -1.0
    for i in range(1, n):  # O(n) iterations, each one batched [N, D] x [D] update; no host sync on CUDA
        j = torch.argmax(dist).view(1)  # first maximum: ties go to the lower index
        picked[i] = j[0]
        c = f.index_select(0, j)[0]
        dist = torch.minimum(dist, (sq - 2 * (f @ c) + sq[j]).clamp_min_(0))
        dist.index_fill_(0, j, -1.0)
    return picked.cpu()


def select(
    scores: Any,
    n: int,
    strategy: str,
    *,
    k: int = 4,
    seed: int | None = 0,
    fill: str = "total",
    labels: Any = None,
) -> torch.Tensor:
    """Select ``n`` inputs from a scored pool.

    Args:
        scores: ``[N]`` real scores (tensor, array or list), or for ``strategy="coverage"`` a
            ``BoolTensor[N, F]`` of covered coverage cells, or for ``strategy="kcenter"`` a float ``[N, D]``
            tensor of features (the greedy runs on its device).
        n: how many to select (>= 0); more than ``N`` returns the whole pool with a warning.
        strategy: ``best``, ``kmst``, ``top``, ``bottom``, ``random``, ``coverage``, ``stratified``,
            ``fol-prop`` or ``kcenter`` (see module docstring).
        k: number of KM-ST sections (``kmst``) or of score-quantile bins (``stratified``).
        seed: seed of the random draws (``kmst``, ``random``, ``stratified``, ``fol-prop``, ``kcenter``'s first
            centre, ``coverage`` with ``fill="random"``).
        fill: how ``coverage`` completes the selection once nothing adds coverage: ``total`` or ``random``.
        labels: ``stratified`` only (optional): int64 ``[N]`` class of each input; the strata are then score
            bin x class.

    Returns:
        int64 CPU tensor of ``min(n, N)`` distinct indices into the pool.
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown selection strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    n = _check_n(n)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"k must be a positive integer, got {k!r}")
    if fill not in FILLS:
        raise ConfigError(f"fill must be 'total' or 'random', got {fill!r}")
    if strategy == "coverage":
        s = _check_bits(scores)
    elif strategy == "kcenter":
        s = _check_features(scores)
    else:
        s = _check_scores(scores)
    pool = s.shape[0]
    if labels is not None and strategy != "stratified":
        raise ConfigError(f"labels apply to strategy 'stratified' only, not {strategy!r}: leave them out")
    lab = _check_labels(labels, pool) if labels is not None else None
    if n > pool:
        warnings.warn(f"asked for {n} inputs but the pool holds only {pool}: returning the whole pool",
                      UserWarning, stacklevel=2)
        n = pool
    gen = torch.Generator().manual_seed(int(seed)) if seed is not None else torch.Generator()
    if seed is None:
        gen.seed()
    if n == 0:
        return torch.zeros(0, dtype=torch.int64)
    if strategy == "top":
        out = torch.sort(-s, stable=True).indices[:n]
    elif strategy == "bottom":
        out = torch.sort(s, stable=True).indices[:n]
    elif strategy == "best":
        asc = torch.sort(s, stable=True).indices
        lo, hi = n // 2, n - n // 2
        out = torch.cat([asc[:lo], asc[pool - hi:].flip(0)])
    elif strategy == "random":
        out = torch.randperm(pool, generator=gen)[:n]
    elif strategy == "kmst":
        out = _kmst(s, n, int(k), gen)
    elif strategy == "stratified":
        out = _stratified(s, n, int(k), lab, gen)
    elif strategy == "fol-prop":
        out = _proportional(s, n, gen)
    elif strategy == "kcenter":
        out = _kcenter(s, n, gen)
    else:
        out = _greedy_coverage(s, n, fill, gen)
    return out.to(torch.int64)
