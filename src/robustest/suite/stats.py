"""Statistics of a stratified suite: the stratified estimate of an accuracy with its interval, the paired
difference of two models on the same samples with its interval, and the exact McNemar test.

Notation: the population (a data split of N samples) is cut into H strata of N_h samples, W_h = N_h / N; the
suite holds n_h samples of stratum h (K = sum n_h). Per-sample outcomes ``v`` lie in [0, 1] (1 = correct /
robust; a fraction for corruption accuracy over several corruptions). Every function takes the per-sample
``stratum`` ids (int64 [K], values in 0..H-1) and the population ``sizes`` N_h (int64 [H]).

* :func:`stratified_estimate`: ``p = sum_h W_h mean_h(v)``; variance
  ``V = sum_h W_h^2 (1 - n_h / N_h) s_h^2 / n_h`` with a small-sample correction of ``s_h^2`` (one
  pseudo-observation per stratum, half at 0 and half at 1, so a stratum whose samples all agree still has a
  variance); the interval is Korn & Graubard's (1998): a Clopper-Pearson interval at the effective sample size
  ``n_eff = p (1 - p) / V`` scaled by ``(t_{K-1} / t_{K-H})^2`` for the degrees of freedom of the variance
  estimate (``n_eff = K`` when p is 0 or 1). It never leaves [0, 1] and has positive width at p = 0 and 1.
* :func:`paired_difference`: ``drop = p_baseline - p_candidate`` on the same samples; interval by Newcombe's
  (1998) hybrid score method for paired data (his method 10) built from the two Korn-Graubard intervals and
  the weighted correlation of the paired outcomes; the exact McNemar test on the discordant pairs.
* :func:`mcnemar_exact`: b = pairs the baseline got right and the candidate wrong, c = the reverse; under
  "no change" b ~ Binomial(b + c, 1/2). One-sided p = P(X >= b); two-sided = min(1, 2 min(P(X >= b), P(X <= b))).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from robustest.core.errors import ConfigError

__all__ = ["Difference", "Estimate", "mcnemar_exact", "outcome_estimates", "paired_difference", "stratified_estimate"]


@dataclass(frozen=True)
class Estimate:
    """A stratified estimate of a mean in [0, 1]: ``value`` with its ``level`` interval [``ci_low``, ``ci_high``];
    ``std_error`` = sqrt(V); ``n_eff``: the effective sample size the interval used; ``df`` = K - H."""

    value: float
    ci_low: float
    ci_high: float
    std_error: float
    n_eff: float
    df: int
    level: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Difference:
    """``drop = baseline - candidate`` (positive: the candidate is worse) with its interval; the exact McNemar test
    on the discordant pairs: ``b`` (baseline right, candidate wrong), ``c`` (the reverse), ``p_value`` one-sided
    (H1: the candidate is worse), ``p_two_sided``; ``phi``: weighted correlation of the paired outcomes."""

    drop: float
    ci_low: float
    ci_high: float
    b: int
    c: int
    p_value: float
    p_two_sided: float
    phi: float
    level: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check(values: torch.Tensor, stratum: torch.Tensor, sizes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                       torch.Tensor]:
    v = torch.as_tensor(values).double().flatten()
    s = torch.as_tensor(stratum).long().flatten()
    n_pop = torch.as_tensor(sizes).double().flatten()
    if v.numel() == 0 or v.shape != s.shape:
        raise ConfigError(f"need one stratum id per outcome, got {v.numel()} outcomes and {s.numel()} ids")
    if not bool(torch.isfinite(v).all()) or float(v.min()) < 0 or float(v.max()) > 1:
        raise ConfigError("outcomes must lie in [0, 1]")
    h = n_pop.numel()
    if int(s.min()) < 0 or int(s.max()) >= h:
        raise ConfigError(f"stratum ids must lie in 0..{h - 1}")
    counts = torch.bincount(s, minlength=h).double()
    if bool((counts == 0).any()) or bool((counts > n_pop).any()):
        raise ConfigError("every stratum needs at least one sample and no more samples than its population size")
    return v, s, n_pop


def sample_weights(stratum: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Each sample's weight W_h / n_h (float64 [K], sums to 1): the stratified mean is ``sum_i w_i v_i``."""
    s = torch.as_tensor(stratum).long().flatten()
    n_pop = torch.as_tensor(sizes).double().flatten()
    counts = torch.bincount(s, minlength=n_pop.numel()).double()
    return (n_pop / n_pop.sum() / counts.clamp(min=1))[s]


def _stratum_moments(v: torch.Tensor, s: torch.Tensor, h: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per stratum: n_h, mean_h and the corrected variance s_h^2 (one pseudo-observation, half at 0, half at 1)."""
    n = torch.bincount(s, minlength=h).double()
    total = torch.zeros(h, dtype=torch.float64).index_add_(0, s, v)
    mean = total / n
    p_tilde = (total + 0.5) / (n + 1.0)
    ss = torch.zeros(h, dtype=torch.float64).index_add_(0, s, (v - p_tilde[s]) ** 2)
    var = (ss + 0.5 * p_tilde ** 2 + 0.5 * (1.0 - p_tilde) ** 2) / n  # (n + 1) observations, 1 degree of freedom used
    return n, mean, var


def _t(q: float, df: float) -> float:
    from scipy.stats import t

    return float(t.ppf(q, df))


def _clopper_pearson(p: float, n: float, alpha: float) -> tuple[float, float]:
    from scipy.stats import beta

    x = p * n
    lo = 0.0 if p <= 0 else float(beta.ppf(alpha / 2, x, n - x + 1))
    hi = 1.0 if p >= 1 else float(beta.ppf(1 - alpha / 2, x + 1, n - x))
    return min(lo, p), max(hi, p)


def stratified_estimate(values: torch.Tensor, stratum: torch.Tensor, sizes: torch.Tensor,
                        level: float = 0.95) -> Estimate:
    """The stratified mean of per-sample outcomes ``values`` (float or bool [K] in [0, 1]) with its Korn-Graubard
    interval (see the module docstring). ``stratum``: int64 [K]; ``sizes``: population sizes N_h, int64 [H]."""
    if not 0 < level < 1:
        raise ConfigError(f"level must lie in (0, 1), got {level}")
    v, s, n_pop = _check(values, stratum, sizes)
    h = n_pop.numel()
    w = n_pop / n_pop.sum()
    n, mean, var = _stratum_moments(v, s, h)
    p = float(min(1.0, max(0.0, float((w * mean).sum()))))
    fpc = (1.0 - n / n_pop).clamp(min=0.0)
    variance = float((w ** 2 * fpc * var / n).sum())
    k = int(v.numel())
    df = max(1, k - h)
    alpha = 1.0 - level
    if variance <= 0:  # every stratum was taken whole: the value is exact for this population
        return Estimate(p, p, p, 0.0, math.inf, df, level)
    n_eff = p * (1 - p) / variance if 0 < p < 1 else float(k)
    if k > 1 and df < k - 1:
        n_eff *= (_t(1 - alpha / 2, k - 1) / _t(1 - alpha / 2, df)) ** 2
    lo, hi = _clopper_pearson(p, n_eff, alpha)
    return Estimate(p, lo, hi, math.sqrt(variance), float(n_eff), df, level)


def outcome_estimates(outcomes: dict[str, Any], stratum: torch.Tensor, sizes: torch.Tensor,
                      level: float = 0.95) -> dict[str, Estimate]:
    """The stratified estimates of a model's per-sample ``outcomes`` on a suite: ``robust_accuracy`` and
    ``clean_accuracy`` (from bool [K] ``robust``, ``clean``), ``corruption_accuracy`` (the mean over the settings of
    bool [K, S] ``corruption``, when S > 0) and ``certified_accuracy`` (bool [K] ``certified``, when present).
    ``stratum``: int64 [K]; ``sizes``: population sizes N_h, int64 [H]."""
    est = {"robust_accuracy": stratified_estimate(outcomes["robust"], stratum, sizes, level),
           "clean_accuracy": stratified_estimate(outcomes["clean"], stratum, sizes, level)}
    if outcomes["corruption"].shape[1]:
        est["corruption_accuracy"] = stratified_estimate(outcomes["corruption"].double().mean(1), stratum, sizes,
                                                         level)
    if outcomes.get("certified") is not None:
        est["certified_accuracy"] = stratified_estimate(outcomes["certified"], stratum, sizes, level)
    return est


def _weighted_correlation(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> float:
    """Weighted Pearson correlation (the phi coefficient for binary outcomes); 0 when either is constant."""
    w = w / w.sum()
    mx, my = float((w * x).sum()), float((w * y).sum())
    cov = float((w * (x - mx) * (y - my)).sum())
    vx, vy = float((w * (x - mx) ** 2).sum()), float((w * (y - my) ** 2).sum())
    if vx <= 1e-15 or vy <= 1e-15:
        return 0.0
    return max(-1.0, min(1.0, cov / math.sqrt(vx * vy)))


def mcnemar_exact(b: int, c: int) -> tuple[float, float]:
    """Exact McNemar test of ``b`` pairs (baseline right, candidate wrong) against ``c`` (the reverse): returns
    (one-sided p = P(X >= b) for X ~ Binomial(b + c, 1/2), two-sided p). Computed in exact integer arithmetic.
    With no discordant pair both are 1."""
    b, c = int(b), int(c)
    if b < 0 or c < 0:
        raise ConfigError(f"discordant counts must be non-negative, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0, 1.0
    total = 2 ** n
    upper = sum(math.comb(n, i) for i in range(b, n + 1))  # P(X >= b)
    lower = sum(math.comb(n, i) for i in range(0, b + 1))  # P(X <= b)
    one = upper / total
    two = min(1.0, 2 * min(upper, lower) / total)
    return float(one), float(two)


def paired_difference(base: torch.Tensor, cand: torch.Tensor, stratum: torch.Tensor, sizes: torch.Tensor,
                      level: float = 0.95) -> Difference:
    """``baseline - candidate`` on the same K samples (outcomes in [0, 1], [K] each): the stratified drop, its
    Newcombe (1998, method 10) interval from the two Korn-Graubard intervals and the weighted correlation phi of
    the pairs, and the exact McNemar test on the discordant pairs (outcomes rounded to 0/1 for the test)."""
    vb, s, n_pop = _check(base, stratum, sizes)
    vc, _, _ = _check(cand, stratum, sizes)
    eb = stratified_estimate(vb, s, n_pop, level)
    ec = stratified_estimate(vc, s, n_pop, level)
    phi = _weighted_correlation(vb, vc, sample_weights(s, n_pop))
    p1, l1, u1 = eb.value, eb.ci_low, eb.ci_high
    p2, l2, u2 = ec.value, ec.ci_low, ec.ci_high
    d = p1 - p2
    lo = d - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = d + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    rb, rc = vb >= 0.5, vc >= 0.5
    b, c = int((rb & ~rc).sum()), int((~rb & rc).sum())
    p_one, p_two = mcnemar_exact(b, c)
    return Difference(d, max(-1.0, lo), min(1.0, hi), b, c, p_one, p_two, phi, level)
