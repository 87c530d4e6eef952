"""Test pools: generation against a model (attacks or fuzzers, each test scored by FOL w.r.t. its seed)
and the selection strategies that pick tests from a pool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from robustest import selection
from robustest.core import reprs
from robustest.core.errors import ConfigError
from robustest.core.seeding import derive_seed
from robustest.evaluate import adversarial_examples
from robustest.robot.config import RANKED_SCORES, RobotConfig, selection_strategies, strategies


# ----------------------------------------------------------------------------------------------- pools
@dataclass
class Pool:
    """Generated tests: ``x`` N x C x H x W in [0, 1], true labels ``y`` int64 [N], ``x0_index`` int64 [N]
    (index of each test's seed in the training data used for fine-tuning), ``method`` (N names) and ``fol``
    (float [N], FOL at eps of each test w.r.t. its seed under the model it was generated against)."""

    x: torch.Tensor
    y: torch.Tensor
    x0_index: torch.Tensor
    method: list[str]
    fol: torch.Tensor

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __repr__(self) -> str:
        fol = float(self.fol.float().median()) if len(self) else None
        return reprs.one_line(self, n=len(self), by_method=reprs.counts(self.counts()), median_fol=fol,
                              x=reprs.shape(self.x))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in self.method:
            out[m] = out.get(m, 0) + 1
        return out

    def subset(self, idx: torch.Tensor) -> Pool:
        il = idx.tolist()
        return Pool(self.x[idx], self.y[idx], self.x0_index[idx], [self.method[i] for i in il], self.fol[idx])

    def payload(self) -> dict[str, Any]:
        return {"x": self.x.float().cpu(), "y": self.y.long().cpu(), "x0_index": self.x0_index.long().cpu(),
                "method": list(self.method), "fol": self.fol.float().cpu()}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> Pool:
        return cls(p["x"], p["y"], p["x0_index"], list(p["method"]), p["fol"])

    @classmethod
    def empty_like(cls, x: torch.Tensor) -> Pool:
        return cls(x[:0].clone(), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), [],
                   torch.zeros(0))

    def concat(self, other: Pool) -> Pool:
        return Pool(torch.cat([self.x, other.x]), torch.cat([self.y, other.y]),
                    torch.cat([self.x0_index, other.x0_index]), self.method + other.method,
                    torch.cat([self.fol, other.fol]))


def fol_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor, x0: torch.Tensor, eps: float) -> torch.Tensor:
    from robustest import metrics

    if x.shape[0] == 0:
        return torch.zeros(0)
    return metrics.fol(model, x, y, x0=x0, eps=eps, norm="linf", batch_size=256).detach().float().cpu()


def generate_pool(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: RobotConfig, seed: int,
                  profile: Any = None, compute: dict[str, Any] | None = None) -> Pool:
    """Generate a test pool from seeds ``x`` (N x C x H x W) / ``y`` (int64 [N]) against ``model`` with the
    configured generator, and score every test by FOL (L-inf, ``cfg.eps``) w.r.t. its seed.

    ``compute``: a dict that receives the passes spent (:class:`~robustest.robot.compute.PassCounter`):
    ``generation`` (the attacks or the fuzzer, with a coverage profile it builds) and ``fol_scoring``."""
    from robustest.core.compute import PassCounter

    with PassCounter(model) as gen_count:
        xa, ya, x0i, meth = _generate(model, x, y, cfg, seed, profile)
    with PassCounter(model) as fol_count:
        fol = fol_of(model, xa, ya, x[x0i], cfg.eps)
    if compute is not None:
        compute["generation"] = gen_count.passes
        compute["fol_scoring"] = fol_count.passes
    return Pool(xa, ya.long(), x0i.long(), list(meth), fol)


def _generate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: RobotConfig, seed: int, profile: Any
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    if cfg.pool_limit is not None and cfg.pool_limit < x.shape[0]:
        g = torch.Generator().manual_seed(derive_seed(seed, "pool-seeds"))
        keep = torch.sort(torch.randperm(x.shape[0], generator=g)[:cfg.pool_limit]).values
    else:
        keep = torch.arange(x.shape[0])
    xs, ys = x[keep], y[keep]
    if cfg.pool == "attack":
        xa, ya, idx, meth = adversarial_examples(model, (xs, ys), cfg.eps, pgd_steps=cfg.pool_pgd_steps,
                                                 seed=derive_seed(seed, "pool-attack"), successful_only=True)
        x0i = keep[idx]
    elif cfg.pool == "fol-fuzz":
        from robustest import fuzzing

        res = fuzzing.fol_fuzz(model, xs, ys, seed=derive_seed(seed, "fol-fuzz"), **cfg.fuzz_options)
        x0i = keep[res.seed_index.long().cpu()]
        xa, ya, meth = res.x.detach().float().cpu(), y[x0i], ["fol-fuzz"] * int(res.x.shape[0])
    else:
        from robustest import fuzzing

        if profile is None:
            profile = coverage_profile_of(model, x, cfg)
        opts = {"metric": cfg.coverage_metric, **cfg.fuzz_options}
        res = fuzzing.coverage_fuzz(model, xs, ys, profile, seed=derive_seed(seed, "cov-fuzz"), **opts)
        x0i = keep[res.seed_index.long().cpu()]
        xa, ya, meth = res.x.detach().float().cpu(), y[x0i], ["cov-fuzz"] * int(res.x.shape[0])
    return xa.clamp(0, 1), ya, x0i, list(meth)


def coverage_profile_of(model: nn.Module, x: torch.Tensor, cfg: RobotConfig) -> Any:
    from robustest.metrics.coverage import CoverageProfile

    return CoverageProfile.build(model, x[:cfg.coverage_profile_limit])


#: the config key holding the ``k`` of a selection strategy that reads one (any other: ``kmst_k``)
K_KEYS = {"stratified": "stratified_bins"}


def _registered(strategy: str) -> selection.Strategy | None:
    """The registry's record of a pool-selection strategy fed by the pool's own data (FOL, coverage bits or
    features); None for a ranked model score (gini), the baselines and unknown names."""
    if strategy in RANKED_SCORES or strategy not in selection_strategies():
        return None
    return selection.get(strategy)


def reads_fol(strategy: str) -> bool:
    """Whether ``strategy`` ranks or samples by the pool's FOL (best, kmst, stratified, fol-prop: a strategy that
    needs scores and reads them), so that its selection cost includes scoring the pool by FOL."""
    spec = _registered(strategy)
    return spec is not None and spec.needs == "scores" and spec.reads_scores


def select_tests(strategy: str, model: nn.Module, pool: Pool, n: int, cfg: RobotConfig, seed: int,
                 profile: Any = None, cache: dict[str, Any] | None = None,
                 compute: dict[str, Any] | None = None) -> torch.Tensor:
    """Indices (int64 [min(n, len(pool))]) of the tests ``strategy`` selects from ``pool``.

    A strategy of :mod:`robustest.selection`'s registry gets what it declares it needs: the pool's FOL
    (best / kmst rank by it; stratified draws at random within FOL-quantile x class strata, with the pool's
    labels as it takes labels; fol-prop samples with probability proportional to FOL; random draws uniformly),
    the penultimate-layer features of ``model`` (kcenter runs k-center greedy, the core-set selection, on
    :func:`robustest.metrics.activations.penultimate_features`) or the ``coverage_metric`` cells each test
    covers (coverage greedily maximises them; profile of ``model``). gini takes the highest DeepGini scores of
    ``model``; all takes the whole pool. ``cache`` keeps per-pool scores (gini, coverage bits, kcenter features)
    between calls on the same pool, with the passes they cost. ``compute``: a dict whose ``selection_scoring``
    receives the passes the strategy's scores cost on this pool (FOL strategies: ``cache["fol_passes"]``, the
    FOL scoring of the pool; also when the scores came from the cache), 0 for random and all.
    """
    cache = {} if cache is None else cache
    cost: float | None = 0.0
    if reads_fol(strategy):
        cost = cache.get("fol_passes")
    if compute is not None:
        compute["selection_scoring"] = cost
    if strategy == "all":
        return torch.arange(len(pool), dtype=torch.long)
    if len(pool) == 0 or n == 0:
        return torch.zeros(0, dtype=torch.long)
    if strategy in RANKED_SCORES:
        return _select_by_gini(strategy, model, pool, n, seed, cache, compute)
    spec = _registered(strategy)
    if spec is None:
        raise ConfigError(f"unknown strategy {strategy!r}: choose one of {', '.join(strategies())}")
    if spec.needs == "features":
        return _select_by_features(strategy, model, pool, n, seed, cache, compute)
    if spec.needs == "bits":
        return _select_by_coverage(strategy, model, pool, n, cfg, seed, profile, cache, compute)
    k = getattr(cfg, K_KEYS.get(strategy, "kmst_k"))
    if spec.labels:
        return selection.select(pool.fol, n, strategy, k=k, seed=seed, labels=pool.y)
    return selection.select(pool.fol, n, strategy, k=k, seed=seed)


def _select_by_gini(strategy: str, model: nn.Module, pool: Pool, n: int, seed: int, cache: dict[str, Any],
                    compute: dict[str, Any] | None) -> torch.Tensor:
    """The pool's DeepGini scores under ``model`` (cached), ranked by the registry's ``RANKED_SCORES`` entry."""
    from robustest.core.compute import PassCounter

    if "gini" not in cache:
        from robustest import metrics

        with PassCounter(model) as pc:
            cache["gini"] = metrics.gini(model, pool.x, batch_size=512).detach().float().cpu()
        cache["gini_passes"] = pc.passes
    if compute is not None:
        compute["selection_scoring"] = cache["gini_passes"]
    return selection.select(cache["gini"], n, RANKED_SCORES[strategy], seed=seed)


def _select_by_features(strategy: str, model: nn.Module, pool: Pool, n: int, seed: int, cache: dict[str, Any],
                        compute: dict[str, Any] | None) -> torch.Tensor:
    """A strategy that needs features, on the pool's penultimate-layer features under ``model`` (cached)."""
    from robustest.core.compute import PassCounter
    from robustest.metrics.activations import penultimate_features

    if "features" not in cache:
        with PassCounter(model) as pc:
            cache["features"] = penultimate_features(model, pool.x)
        cache["features_passes"] = pc.passes
    if compute is not None:
        compute["selection_scoring"] = cache["features_passes"]
    return selection.select(cache["features"], n, strategy, seed=seed)


def _select_by_coverage(strategy: str, model: nn.Module, pool: Pool, n: int, cfg: RobotConfig, seed: int,
                        profile: Any, cache: dict[str, Any], compute: dict[str, Any] | None) -> torch.Tensor:
    """A strategy that needs coverage bits, on the ``coverage_metric`` cells each pool test covers (cached;
    ``profile`` of ``model``, built from the pool when None)."""
    from robustest.core.compute import PassCounter

    if "bits" not in cache:
        with PassCounter(model) as pc:
            prof = profile if profile is not None else coverage_profile_of(model, pool.x, cfg)
            cache["bits"] = prof.bits(pool.x, cfg.coverage_metric, **cfg.coverage_options).cpu()
        cache["bits_passes"] = pc.passes
    if compute is not None:
        prof_cost = cache.get("profile_passes", 0.0)
        compute["selection_scoring"] = None if None in (prof_cost, cache["bits_passes"]) else \
            prof_cost + cache["bits_passes"]
    return selection.select(cache["bits"], n, strategy, seed=seed)
