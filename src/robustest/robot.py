"""The RobOT loop: generate tests -> score them by FOL -> select a budget -> fine-tune -> measure
robustness -> decide whether robustness has converged (METHODS.md A4).

Two entry points, both driven by a :class:`RobotConfig` (a dataclass, loadable from YAML or a dict):

* :func:`run` - the iterative loop. Round r generates a pool of tests against the current model
  (FGSM + PGD on the training set as in the paper, FOL-guided fuzzing or coverage-guided fuzzing), scores
  it by FOL, selects ``budget`` tests with ``strategy``, fine-tunes the current model on the training data
  plus every test selected so far, and measures robustness. It stops when the robustness requirement is
  met, when the FOL convergence rule fires, or when the rounds or the time budget run out.
* :func:`compare` - the honest strategy comparison: ONE pool generated against the original model, and
  the original model fine-tuned once per (budget, strategy, seed) cell.

Robustness is measured with :func:`robustest.robustness.measure`: clean accuracy, accuracy on the fixed
adversarial set (successful FGSM/PGD examples of the test split against the ORIGINAL model; the paper's
measure, 0 % for the original model) and white-box accuracy of the current model (PGD with restarts and
APGD-CE). Fine-tuning picks its checkpoint on a validation split carved from the training data (clean
validation images plus their FGSM/PGD examples against the original model), never on an evaluation set;
the last epoch's clean and fixed-set figures are reported too.

FOL convergence rule. After every round (and for the original model, round 0) fresh PGD tests are
generated against the current model from ``convergence_probe`` training images (10 steps of eps/6,
random start) and their FOL values computed; the statistic is the median FOL m_r. The relative change
``|m_r - m_{r-1}| / |m_{r-1}|`` is recorded every round; the rule fires when it stays below
``convergence_tol`` for ``convergence_patience`` consecutive rounds.

Resume. Every round (every comparison cell) writes its state atomically under ``OUT/state/``: the model
checkpoint, the selected tests with their pool indices, and a JSON record written last. With
``resume=True`` finished rounds/cells are loaded instead of recomputed. Every unit of work is seeded from
(seed, round or cell, purpose), so a resumed run writes the same ``results.json`` as an uninterrupted one;
wall-clock timings live in ``timings.json``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from robustest import data as datasets
from robustest.errors import ConfigError, DataError
from robustest.robustness import FixedAdversarialSet, RobustnessReport, adversarial_examples, build_fixed_set, measure
from robustest.runtime import atomic_save, atomic_write_json, resolve_device

__all__ = [
    "POOLS",
    "STRATEGIES",
    "Pool",
    "RobotConfig",
    "compare",
    "convergence_update",
    "derive_seed",
    "parse_budget",
    "run",
]

RESULTS_FORMAT = "robustest-robot-results"
RESULTS_VERSION = 1
POOLS = ("attack", "fol-fuzz", "cov-fuzz")
STRATEGIES = ("best", "kmst", "gini", "random", "coverage")
METRICS = ("clean_accuracy", "fixed_set_accuracy", "whitebox_accuracy", "whitebox_pgd_accuracy",
           "whitebox_apgd_accuracy")
# config keys that do not change results (left out of results.json and of the resume check)
_RUNTIME_KEYS = ("out", "resume", "progress", "verbose", "device")
# keys a resumed run may change: they decide how many rounds/cells run, not what a finished one contains
_EXTENDABLE_KEYS = ("rounds", "time_budget", "target", "target_metric", "strategies", "budgets", "seeds", "examples")


# ---------------------------------------------------------------------------------------------- config
@dataclass
class RobotConfig:
    """Settings of a RobOT run or strategy comparison (all validated by :meth:`validate`).

    Model and data: ``model`` is a checkpoint path (None: train ``train_model`` for ``train_epochs`` on the
    training split first). ``dataset``/``data_dir`` name the data (:func:`robustest.data.load`);
    ``train_limit``/``test_limit`` keep only the first N images of a split.
    Tests: ``eps`` (L-inf radius, pixel scale); ``pool`` is ``attack`` (successful FGSM + PGD examples of the
    training set, the paper's pool), ``fol-fuzz`` or ``cov-fuzz``; ``pool_limit`` uses only N training
    images as seeds; ``fuzz_options`` are passed to the fuzzer.
    Selection: ``strategy`` (loop) or ``strategies`` (comparison) from best, kmst, gini, random, coverage;
    ``budget`` (loop) or ``budgets`` (comparison): a count (int) or a percentage of the pool ("5%").
    Fine-tuning: ``epochs``, ``batch_size``, ``lr`` (Adam), validation split ``val_fraction`` of the
    training data (plus its adversarial examples when ``val_adversarial``).
    Loop: ``rounds``, ``time_budget`` (seconds), ``target`` (stop once ``target_metric`` >= target),
    convergence rule ``convergence_tol``/``convergence_patience``/``convergence_probe``.
    Measurement: ``whitebox`` (on the first ``whitebox_limit`` test images), PGD steps/restarts, APGD steps,
    ``corruptions`` (None, "all" or a list). ``seeds``: comparison seeds; ``seed``: everything else.
    """

    model: str | None = None
    train_model: str = "digits_cnn"
    train_epochs: int = 30
    dataset: str = "digits"
    data_dir: str | None = None
    train_limit: int | None = None
    test_limit: int | None = None
    eps: float = 0.3
    pool: str = "attack"
    pool_limit: int | None = None
    pool_pgd_steps: int = 10
    fuzz_options: dict[str, Any] = field(default_factory=dict)
    strategy: str = "best"
    strategies: list[str] | None = None
    budget: int | str = "5%"
    budgets: list[int | str] | None = None
    kmst_k: int = 4
    coverage_metric: str = "kmnc"
    coverage_options: dict[str, Any] = field(default_factory=dict)
    coverage_profile_limit: int = 2000
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    val_fraction: float = 0.1
    val_adversarial: bool = True
    rounds: int = 3
    time_budget: float | None = None
    target_metric: str = "whitebox_accuracy"
    target: float | None = None
    convergence_tol: float = 0.05
    convergence_patience: int = 2
    convergence_probe: int = 500
    whitebox: bool = True
    whitebox_limit: int | None = 1000
    whitebox_pgd_steps: int = 20
    whitebox_restarts: int = 2
    apgd_steps: int = 50
    whitebox_last: bool = False
    corruptions: str | list[str] | None = None
    seeds: list[int] = field(default_factory=lambda: [0])
    seed: int = 0
    examples: int = 16
    device: str | None = None
    out: str = "robot-out"
    resume: bool = False
    progress: bool = False
    verbose: bool = True

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RobotConfig:
        """Build and validate a config from a plain dict; unknown keys are a one-line ConfigError."""
        if not isinstance(d, dict):
            raise ConfigError(f"a RobOT config must be a mapping of settings, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        norm = {str(k).replace("-", "_"): v for k, v in d.items()}
        unknown = sorted(set(norm) - known)
        if unknown:
            raise ConfigError(f"unknown config key {unknown[0]!r}: valid keys are {', '.join(sorted(known))}")
        cfg = cls(**norm)
        cfg.validate()
        return cfg

    @classmethod
    def from_yaml(cls, path: str | Path) -> RobotConfig:
        """Read a YAML (or JSON) config file; see :meth:`from_dict`."""
        import yaml

        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist: pass a YAML file with --config")
        try:
            d = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"config file {path} is not valid YAML{where}: fix the syntax") from exc
        return cls.from_dict(d or {})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def result_dict(self) -> dict[str, Any]:
        """The settings that determine the results (runtime-only keys left out)."""
        return {k: v for k, v in self.to_dict().items() if k not in _RUNTIME_KEYS}

    # ------------------------------------------------------------------ validation
    def validate(self) -> RobotConfig:
        """Check every setting; raises ConfigError with a one-line message naming the key and the fix."""
        def pos_int(name: str, allow_none: bool = False, minimum: int = 1) -> None:
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
                raise ConfigError(f"{name} must be an integer >= {minimum}, got {v!r}")

        def number(name: str, lo: float, hi: float, allow_none: bool = False, lo_open: bool = True) -> None:
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
                    (v <= lo if lo_open else v < lo) or v > hi:
                raise ConfigError(f"{name} must be a number in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")

        if self.model is not None and not isinstance(self.model, str):
            raise ConfigError(f"model must be a checkpoint path, got {self.model!r}")
        from robustest import models as zoo

        try:
            zoo.resolve_name(self.train_model)
        except ConfigError as exc:
            raise ConfigError(f"train_model: {exc}") from exc
        if self.dataset not in datasets.names():
            raise ConfigError(f"unknown dataset {self.dataset!r}: choose one of {', '.join(datasets.names())}")
        pos_int("train_epochs", minimum=0)
        pos_int("train_limit", allow_none=True)
        pos_int("test_limit", allow_none=True)
        number("eps", 0.0, 1.0)
        if self.pool not in POOLS:
            raise ConfigError(f"unknown pool {self.pool!r}: use one of {', '.join(POOLS)}")
        pos_int("pool_limit", allow_none=True)
        pos_int("pool_pgd_steps")
        for name in ("fuzz_options", "coverage_options"):
            if not isinstance(getattr(self, name), dict):
                raise ConfigError(f"{name} must be a mapping of keyword arguments, got {getattr(self, name)!r}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if self.strategies is not None:
            if not isinstance(self.strategies, (list, tuple)) or not self.strategies:
                raise ConfigError(f"strategies must be a non-empty list, e.g. [best, kmst, gini, random], "
                                  f"got {self.strategies!r}")
            for s in self.strategies:
                if s not in STRATEGIES:
                    raise ConfigError(f"unknown strategy {s!r} in strategies: choose from {', '.join(STRATEGIES)}")
            if len(set(self.strategies)) != len(self.strategies):
                raise ConfigError("strategies lists a strategy twice: name each once")
            self.strategies = list(self.strategies)
        parse_budget(self.budget, 100)
        if self.budgets is not None:
            if not isinstance(self.budgets, (list, tuple)) or not self.budgets:
                raise ConfigError(f"budgets must be a non-empty list such as ['1%', '2%'], got {self.budgets!r}")
            for b in self.budgets:
                parse_budget(b, 100)
            self.budgets = list(self.budgets)
        pos_int("kmst_k")
        if self.coverage_metric not in ("nc", "kmnc", "nbc", "snac", "tknc"):
            raise ConfigError(f"unknown coverage_metric {self.coverage_metric!r}: use nc, kmnc, nbc, snac or tknc")
        pos_int("coverage_profile_limit")
        pos_int("epochs")
        pos_int("batch_size")
        number("lr", 0.0, 10.0)
        number("val_fraction", 0.0, 0.5)
        pos_int("rounds")
        number("time_budget", 0.0, float("inf"), allow_none=True)
        if self.target_metric not in METRICS:
            raise ConfigError(f"unknown target_metric {self.target_metric!r}: use one of {', '.join(METRICS)}")
        number("target", 0.0, 1.0, allow_none=True, lo_open=False)
        number("convergence_tol", 0.0, float("inf"), lo_open=False)
        pos_int("convergence_patience")
        pos_int("convergence_probe")
        pos_int("whitebox_limit", allow_none=True)
        pos_int("whitebox_pgd_steps")
        pos_int("whitebox_restarts")
        pos_int("apgd_steps", minimum=0)
        if not isinstance(self.seeds, (list, tuple)) or not self.seeds or \
                not all(isinstance(s, int) and not isinstance(s, bool) for s in self.seeds):
            raise ConfigError(f"seeds must be a non-empty list of integers, got {self.seeds!r}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("seeds lists a seed twice: name each once")
        self.seeds = list(self.seeds)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        pos_int("examples", minimum=0)
        if self.corruptions is not None and not isinstance(self.corruptions, (str, list)):
            raise ConfigError(f"corruptions must be null, 'all' or a list of names, got {self.corruptions!r}")
        if not isinstance(self.out, str) or not self.out:
            raise ConfigError(f"out must be a folder path, got {self.out!r}")
        return self


def parse_budget(budget: int | str, pool_size: int) -> int:
    """Number of tests a budget selects from a pool of ``pool_size``: an int is a count, ``"p%"`` a
    percentage of the pool (rounded, at least 1 when the pool is not empty)."""
    if isinstance(budget, bool):
        raise ConfigError(f"budget must be a count (e.g. 100) or a percentage of the pool (e.g. '5%'), got {budget!r}")
    if isinstance(budget, (int, np.integer)):
        if budget < 1:
            raise ConfigError(f"budget must be a positive count or a percentage such as '5%', got {budget}")
        return int(min(budget, pool_size))
    if isinstance(budget, str):
        text = budget.strip()
        try:
            if text.endswith("%"):
                p = float(text[:-1])
                if not 0 < p <= 100:
                    raise ValueError
                return int(min(pool_size, max(1 if pool_size else 0, round(pool_size * p / 100.0))))
            n = int(text)
            if n < 1:
                raise ValueError
            return min(n, pool_size)
        except ValueError:
            pass
    raise ConfigError(f"budget must be a count (e.g. 100) or a percentage of the pool in (0, 100] (e.g. '5%'), "
                      f"got {budget!r}")


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed derived from ``parts`` (stable across runs and processes)."""
    digest = hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


# ------------------------------------------------------------------------------------- convergence rule
def convergence_update(history: list[float], tol: float, patience: int) -> dict[str, Any]:
    """Apply the FOL convergence rule to the per-round statistic ``history`` (m_0, m_1, ..., m_r).

    Returns ``{"statistic": m_r, "rel_change": |m_r - m_{r-1}| / |m_{r-1}| (None for r = 0),
    "streak": consecutive rounds with rel_change < tol, "converged": streak >= patience}``.
    """
    if not history:
        raise ConfigError("convergence_update needs at least one statistic")
    streak, rel = 0, None
    for prev, cur in zip(history[:-1], history[1:]):
        rel = abs(cur - prev) / max(abs(prev), 1e-12)
        streak = streak + 1 if rel < tol else 0
    return {"statistic": float(history[-1]), "rel_change": rel, "streak": streak, "converged": streak >= patience}


def _quantiles(t: torch.Tensor) -> dict[str, float | None]:
    if t.numel() == 0:
        return {"n": 0, "mean": None, "std": None, "min": None, "q25": None, "median": None, "q75": None, "max": None}
    t = t.double()
    q = torch.quantile(t, torch.tensor([0.25, 0.5, 0.75], dtype=torch.double)).tolist()
    return {"n": int(t.numel()), "mean": float(t.mean()), "std": float(t.std()) if t.numel() > 1 else 0.0,
            "min": float(t.min()), "q25": q[0], "median": q[1], "q75": q[2], "max": float(t.max())}


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


def _fol(model: nn.Module, x: torch.Tensor, y: torch.Tensor, x0: torch.Tensor, eps: float) -> torch.Tensor:
    from robustest import metrics

    if x.shape[0] == 0:
        return torch.zeros(0)
    return metrics.fol(model, x, y, x0=x0, eps=eps, norm="linf", batch_size=256).detach().float().cpu()


def generate_pool(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: RobotConfig, seed: int,
                  profile: Any = None) -> Pool:
    """Generate a test pool from seeds ``x`` (N x C x H x W) / ``y`` (int64 [N]) against ``model`` with the
    configured generator, and score every test by FOL (L-inf, ``cfg.eps``) w.r.t. its seed."""
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
            profile = _coverage_profile(model, x, cfg)
        opts = {"metric": cfg.coverage_metric, **cfg.fuzz_options}
        res = fuzzing.coverage_fuzz(model, xs, ys, profile, seed=derive_seed(seed, "cov-fuzz"), **opts)
        x0i = keep[res.seed_index.long().cpu()]
        xa, ya, meth = res.x.detach().float().cpu(), y[x0i], ["cov-fuzz"] * int(res.x.shape[0])
    xa = xa.clamp(0, 1)
    fol = _fol(model, xa, ya, x[x0i], cfg.eps)
    return Pool(xa, ya.long(), x0i.long(), list(meth), fol)


def _coverage_profile(model: nn.Module, x: torch.Tensor, cfg: RobotConfig) -> Any:
    from robustest.metrics.coverage import CoverageProfile

    return CoverageProfile.build(model, x[:cfg.coverage_profile_limit])


def select_tests(strategy: str, model: nn.Module, pool: Pool, n: int, cfg: RobotConfig, seed: int,
                 profile: Any = None, cache: dict[str, Any] | None = None) -> torch.Tensor:
    """Indices (int64 [min(n, len(pool))]) of the tests ``strategy`` selects from ``pool``.

    best / kmst rank by the pool's FOL; gini takes the highest DeepGini scores of ``model``; random draws
    uniformly; coverage greedily maximises the ``coverage_metric`` cells covered (profile of ``model``).
    ``cache`` keeps per-pool scores (gini, coverage bits) between calls on the same pool.
    """
    from robustest import selection

    cache = {} if cache is None else cache
    if len(pool) == 0 or n == 0:
        return torch.zeros(0, dtype=torch.long)
    if strategy in ("best", "kmst", "random"):
        return selection.select(pool.fol, n, strategy, k=cfg.kmst_k, seed=seed)
    if strategy == "gini":
        if "gini" not in cache:
            from robustest import metrics

            cache["gini"] = metrics.gini(model, pool.x, batch_size=512).detach().float().cpu()
        return selection.select(cache["gini"], n, "top", seed=seed)
    if strategy == "coverage":
        if "bits" not in cache:
            prof = profile if profile is not None else _coverage_profile(model, pool.x, cfg)
            cache["bits"] = prof.bits(pool.x, cfg.coverage_metric, **cfg.coverage_options).cpu()
        return selection.select(cache["bits"], n, "coverage", seed=seed)
    raise ConfigError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")


# ------------------------------------------------------------------------------------------- the setup
@dataclass
class _Setup:
    model0: nn.Module
    x_fit: torch.Tensor
    y_fit: torch.Tensor
    val: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    fixed: FixedAdversarialSet
    baseline: RobustnessReport
    info: dict[str, Any]
    device: torch.device
    timings: dict[str, float] = field(default_factory=dict)


def _log(cfg: RobotConfig, msg: str) -> None:
    if cfg.verbose:
        import sys

        print(msg, file=sys.stderr, flush=True)


def _limit(ds: Any, n: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = ds.tensors[0], ds.tensors[1]
    if n is not None and n < len(x):
        x, y = x[:n], y[:n]
    return x.contiguous(), y.contiguous()


def _fingerprint(cfg: RobotConfig, kind: str) -> str:
    d = {k: v for k, v in cfg.result_dict().items() if k not in _EXTENDABLE_KEYS}
    return hashlib.sha256(json.dumps([kind, d], sort_keys=True, default=str).encode()).hexdigest()


def _prepare_out(cfg: RobotConfig, kind: str) -> Path:
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out {str(out)!r} exists and is not a folder: choose another path")
    marker = out / "state" / "run.json"
    fp = _fingerprint(cfg, kind)
    if marker.is_file():
        try:
            prev = json.loads(marker.read_text())
        except (OSError, json.JSONDecodeError):
            prev = {}
        if not cfg.resume:
            raise ConfigError(f"{out} already holds a run: pass --resume to continue it or choose another --out")
        if prev.get("fingerprint") != fp:
            raise ConfigError(f"{out} holds a run with different settings: resume with the same config or use "
                              "another --out")
    atomic_write_json(marker, {"kind": kind, "fingerprint": fp, "config": cfg.result_dict()})
    return out


def _train_original(cfg: RobotConfig, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                    device: torch.device) -> nn.Module:
    from robustest import models as zoo
    from robustest.training import fit

    mean = x.mean(dim=(0, 2, 3)).tolist()
    std = x.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist()
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    model = zoo.create(cfg.train_model, num_classes=max(num_classes, 2), in_channels=x.shape[1],
                       input_size=x.shape[2], mean=mean, std=std).to(device)
    fit(model, (x, y), epochs=cfg.train_epochs, batch_size=cfg.batch_size, lr=cfg.lr,
        seed=derive_seed(cfg.seed, "train-original"), device=device, progress=cfg.progress)
    return model


def _measure(model: nn.Module, setup_test: tuple[torch.Tensor, torch.Tensor], fixed: FixedAdversarialSet,
             cfg: RobotConfig, seed: int, whitebox: bool | None = None) -> RobustnessReport:
    return measure(model, setup_test, eps=cfg.eps, fixed=fixed,
                   whitebox=cfg.whitebox if whitebox is None else whitebox, whitebox_limit=cfg.whitebox_limit,
                   pgd_steps=cfg.whitebox_pgd_steps, pgd_restarts=cfg.whitebox_restarts, apgd_steps=cfg.apgd_steps,
                   corruptions=cfg.corruptions, seed=seed)


def _rob(rep: RobustnessReport) -> dict[str, Any]:
    d = rep.to_dict()
    d.pop("seconds", None)
    return d


def _setup(cfg: RobotConfig, out: Path, model: nn.Module | None) -> _Setup:
    """Load data and model, carve the validation split, build (or load) the fixed adversarial set and the
    baseline measurement; everything cached under OUT/state so a resumed run reuses it."""
    from robustest.training import load_checkpoint, save_checkpoint

    t0 = time.perf_counter()
    device = resolve_device(model, cfg.device) if (cfg.device or model is not None) else torch.device("cpu")
    train = datasets.load(cfg.dataset, root=cfg.data_dir, split="train")
    test = datasets.load(cfg.dataset, root=cfg.data_dir, split="test")
    x_tr, y_tr = _limit(train, cfg.train_limit)
    x_te, y_te = _limit(test, cfg.test_limit)
    n = x_tr.shape[0]
    n_val = max(1, int(round(n * cfg.val_fraction)))
    if n - n_val < 2:
        raise DataError(f"only {n} training images: too few to carve a validation split (use more data)")
    g = torch.Generator().manual_seed(derive_seed(cfg.seed, "val-split"))
    perm = torch.randperm(n, generator=g)
    val_idx, fit_idx = torch.sort(perm[:n_val]).values, torch.sort(perm[n_val:]).values
    x_fit, y_fit = x_tr[fit_idx], y_tr[fit_idx]
    x_val, y_val = x_tr[val_idx], y_tr[val_idx]
    state = out / "state"
    timings: dict[str, float] = {"load_data_s": time.perf_counter() - t0}

    t1 = time.perf_counter()
    orig_path = state / "original_model.pt"
    if model is None and cfg.model is not None:
        model = load_checkpoint(cfg.model, map_location=device)
    elif model is None:
        if orig_path.is_file():
            model = load_checkpoint(orig_path, map_location=device)
        else:
            _log(cfg, f"training {cfg.train_model} on {cfg.dataset} ({len(x_tr)} images, {cfg.train_epochs} epochs)")
            model = _train_original(cfg, x_tr, y_tr, int(max(y_tr.max(), y_te.max())) + 1, device)
            save_checkpoint(orig_path, model, metadata={"dataset": cfg.dataset, "epochs": cfg.train_epochs})
    model = model.to(device).eval()
    _check_fits(model, x_tr, y_tr)
    timings["original_model_s"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    setup_path = state / "setup.pt"
    if setup_path.is_file():
        p = torch.load(setup_path, map_location="cpu", weights_only=True)
        fixed = FixedAdversarialSet(x=p["fixed_x"], y=p["fixed_y"], source_index=p["fixed_index"],
                                    method=list(p["fixed_method"]), eps=float(p["eps"]),
                                    num_source=int(p["fixed_num_source"]), settings=dict(p["fixed_settings"]))
        val_x, val_y = p["val_x"], p["val_y"]
        base_json = json.loads((state / "baseline.json").read_text())
        baseline = RobustnessReport(**base_json)
    else:
        _log(cfg, f"building the fixed adversarial set from {len(x_te)} test images (eps {cfg.eps})")
        fixed = build_fixed_set(model, (x_te, y_te), cfg.eps, seed=derive_seed(cfg.seed, "fixed-set"))
        val_x, val_y = x_val, y_val
        if cfg.val_adversarial:
            xa, ya, _, _ = adversarial_examples(model, (x_val, y_val), cfg.eps, pgd_steps=cfg.pool_pgd_steps,
                                                seed=derive_seed(cfg.seed, "val-adv"))
            val_x, val_y = torch.cat([x_val, xa]), torch.cat([y_val, ya])
        baseline = _measure(model, (x_te, y_te), fixed, cfg, derive_seed(cfg.seed, "measure", "baseline"))
        atomic_write_json(state / "baseline.json", baseline.to_dict())
        atomic_save({"fixed_x": fixed.x, "fixed_y": fixed.y, "fixed_index": fixed.source_index,
                     "fixed_method": fixed.method, "eps": fixed.eps, "fixed_num_source": fixed.num_source,
                     "fixed_settings": fixed.settings, "val_x": val_x, "val_y": val_y}, setup_path)
    timings["fixed_set_and_baseline_s"] = time.perf_counter() - t2
    from robustest import models as zoo

    try:
        spec = zoo.spec_of(model)
    except Exception:  # noqa: BLE001 - a model outside the zoo has no spec
        spec = {"name": type(model).__name__}
    info = {
        "dataset": cfg.dataset, "num_train": int(n), "num_fit": int(len(x_fit)), "num_val_clean": int(n_val),
        "num_val": int(len(val_x)), "num_test": int(len(x_te)), "model": spec,
        "fixed_set": {"size": len(fixed), "num_source": fixed.num_source, "by_attack": fixed.counts(),
                      "eps": fixed.eps, **fixed.settings},
    }
    return _Setup(model0=model, x_fit=x_fit, y_fit=y_fit, val=(val_x, val_y), test=(x_te, y_te), fixed=fixed,
                  baseline=baseline, info=info, device=device, timings=timings)


def _check_fits(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    spec = getattr(model, "robustest_spec", None) or {}
    c, k = spec.get("in_channels"), spec.get("num_classes")
    if c is not None and x.shape[1] != c:
        raise ConfigError(f"the model takes {c}-channel images but the data has {x.shape[1]}: check dataset/model")
    if k is not None and int(y.max()) >= k:
        raise ConfigError(f"the data has label {int(y.max())} but the model has {k} classes: check dataset/model")


# ---------------------------------------------------------------------------------------- fine-tuning
def _finetune(model0: nn.Module, setup: _Setup, tests: Pool, cfg: RobotConfig, seed: int
              ) -> tuple[nn.Module, nn.Module | None, dict[str, Any]]:
    """Fine-tune a copy of ``model0`` on the training data + ``tests``; pick the checkpoint on the validation
    split. Returns (selected model, last-epoch model or None when it is the selected one, history dict)."""
    from robustest.training import fit

    model = copy.deepcopy(model0)
    last: dict[str, Any] = {}

    def keep_last(epoch: int, m: nn.Module, stats: Any) -> None:
        if epoch == cfg.epochs:
            last["state"] = {k: v.detach().clone() for k, v in m.state_dict().items()}

    x = torch.cat([setup.x_fit, tests.x]) if len(tests) else setup.x_fit
    y = torch.cat([setup.y_fit, tests.y]) if len(tests) else setup.y_fit
    hist = fit(model, (x, y), epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, optimizer="adam",
               val=setup.val, seed=seed, device=setup.device, progress=cfg.progress, restore_best=True,
               on_epoch_end=keep_last)
    last_model = None
    if hist.best_epoch != cfg.epochs and "state" in last:
        last_model = copy.deepcopy(model)
        last_model.load_state_dict(last["state"])
        last_model.eval()
    h = hist.to_dict()
    for e in h["epochs"]:
        e.pop("seconds", None)
    secs = h.pop("seconds", 0.0)
    h["num_train"] = int(len(x))
    return model, last_model, {"history": h, "seconds": secs}


def _last_figures(best: RobustnessReport, last_model: nn.Module | None, setup: _Setup, cfg: RobotConfig,
                  seed: int) -> dict[str, Any]:
    if last_model is None:
        return {**_rob(best), "same_as_selected": True}
    rep = _measure(last_model, setup.test, setup.fixed, cfg, seed, whitebox=cfg.whitebox and cfg.whitebox_last)
    return {**_rob(rep), "same_as_selected": False}


def _convergence_stat(model: nn.Module, setup: _Setup, cfg: RobotConfig, seed: int) -> tuple[torch.Tensor, dict]:
    """FOL values of fresh PGD tests against ``model`` from the fixed probe subset of the training data."""
    from robustest import attacks

    g = torch.Generator().manual_seed(derive_seed(cfg.seed, "probe"))
    m = min(cfg.convergence_probe, len(setup.x_fit))
    idx = torch.sort(torch.randperm(len(setup.x_fit), generator=g)[:m]).values
    x0, y0 = setup.x_fit[idx], setup.y_fit[idx]
    res = attacks.attack("pgd", model, (x0, y0), eps=cfg.eps, alpha=cfg.eps / 6, steps=cfg.pool_pgd_steps,
                         random_start=True, seed=seed)
    fol = _fol(model, res.adv.detach().cpu(), y0, x0, cfg.eps)
    return fol, {"fol": _quantiles(fol), "attack_success_rate": float(res.success.float().mean())}


# ----------------------------------------------------------------------------------------------- run()
def run(config: RobotConfig | dict[str, Any], model: nn.Module | None = None) -> dict[str, Any]:
    """Run the RobOT loop (or, when ``config.strategies`` is set, the strategy comparison :func:`compare`).

    ``model``: the model to test and improve (default: ``config.model`` loaded, or trained from scratch).
    Writes results.json, timings.json, summary.csv and report.html to ``config.out`` and returns the
    results dict (schema in docs/RESULTS_SCHEMA.md).
    """
    cfg = config if isinstance(config, RobotConfig) else RobotConfig.from_dict(config)
    cfg.validate()
    if cfg.strategies is not None:
        return compare(cfg, model=model)
    out = _prepare_out(cfg, "loop")
    t_start = time.perf_counter()
    setup = _setup(cfg, out, model)
    timings: dict[str, Any] = {"setup": setup.timings, "rounds": []}
    state = out / "state"
    model_cur = setup.model0
    tests = Pool.empty_like(setup.x_fit)
    probe_path = state / "round000_fol.pt"
    if probe_path.is_file():
        p = torch.load(probe_path, map_location="cpu", weights_only=True)
        fol0, conv0 = p["fol"], p["info"]
    else:
        fol0, conv0 = _convergence_stat(model_cur, setup, cfg, derive_seed(cfg.seed, "probe-attack", 0))
        atomic_save({"fol": fol0, "info": conv0}, probe_path)
    stats = [conv0["fol"]["median"]]
    fol_by_round = {0: fol0}
    rounds: list[dict[str, Any]] = []
    stop_reason = "rounds"
    elapsed_prev = 0.0
    tpath = out / "timings.json"
    if cfg.resume and tpath.is_file():
        try:
            elapsed_prev = float(json.loads(tpath.read_text()).get("elapsed_s", 0.0))
        except (OSError, ValueError, json.JSONDecodeError):
            elapsed_prev = 0.0
    for r in range(1, cfg.rounds + 1):
        rdir = state / f"round{r:03d}"
        rec_path = rdir / "round.json"
        if rec_path.is_file():  # finished earlier: load, do not redo
            from robustest.training import load_checkpoint

            rec = json.loads(rec_path.read_text())
            model_cur = load_checkpoint(rdir / "model.pt", map_location=setup.device)
            sel = Pool.from_payload(torch.load(rdir / "selected.pt", map_location="cpu", weights_only=True))
            tests = tests.concat(sel)
            fol_by_round[r] = torch.load(rdir / "fol.pt", map_location="cpu", weights_only=True)
            rounds.append(rec)
            stats.append(rec["convergence"]["statistic"])
            _log(cfg, f"round {r}: loaded (finished earlier)")
        else:
            if cfg.time_budget is not None and elapsed_prev + time.perf_counter() - t_start >= cfg.time_budget:
                stop_reason = "time"
                break
            rec, model_cur, sel, fol_r, tr = _one_round(r, model_cur, setup, tests, cfg, stats, rdir)
            tests = tests.concat(sel)
            fol_by_round[r] = fol_r
            rounds.append(rec)
            stats.append(rec["convergence"]["statistic"])
            timings["rounds"].append(tr)
        rob = rec["robustness"]
        _log(cfg, f"round {r}: pool {rec['pool']['size']}, selected {rec['selected']['n']}, "
                  f"clean {_f(rob['clean_accuracy'])}, "
                  f"fixed-set {_f(rob['fixed_set_accuracy'])}, white-box {_f(rob['whitebox_accuracy'])}, "
                  f"median FOL {rec['convergence']['statistic']:.4g}")
        if cfg.target is not None and rob.get(cfg.target_metric) is not None and rob[cfg.target_metric] >= cfg.target:
            stop_reason = "requirement"
            break
        if rec["convergence"]["converged"]:
            stop_reason = "converged"
            break
    results = {
        "format": RESULTS_FORMAT, "version": RESULTS_VERSION, "kind": "loop",
        "config": cfg.result_dict(), "data": setup.info, "baseline": _rob(setup.baseline),
        "convergence_rule": {"statistic": "median FOL of fresh PGD tests on the probe set",
                             "tol": cfg.convergence_tol, "patience": cfg.convergence_patience,
                             "probe": min(cfg.convergence_probe, len(setup.x_fit)), "round0": conv0},
        "rounds": rounds, "stop_reason": stop_reason, "rounds_completed": len(rounds),
        "num_selected_total": len(tests),
    }
    elapsed = elapsed_prev + time.perf_counter() - t_start
    timings["elapsed_s"] = elapsed
    _write_outputs(out, results, timings, setup, cfg, fol_by_round=fol_by_round, examples=tests, compare_data=None)
    return results


def _f(v: Any) -> str:
    return "-" if v is None else f"{v:.4f}"


def _one_round(r: int, model_cur: nn.Module, setup: _Setup, tests: Pool, cfg: RobotConfig, stats: list[float],
               rdir: Path) -> tuple[dict[str, Any], nn.Module, Pool, torch.Tensor, dict[str, float]]:
    from robustest.training import save_checkpoint

    t0 = time.perf_counter()
    seed_r = derive_seed(cfg.seed, "round", r)
    profile = _coverage_profile(model_cur, setup.x_fit, cfg) if (
        cfg.strategy == "coverage" or cfg.pool == "cov-fuzz") else None
    pool = generate_pool(model_cur, setup.x_fit, setup.y_fit, cfg, derive_seed(seed_r, "pool"), profile=profile)
    t_pool = time.perf_counter() - t0
    n = parse_budget(cfg.budget, len(pool))
    t1 = time.perf_counter()
    idx = select_tests(cfg.strategy, model_cur, pool, n, cfg, derive_seed(seed_r, "select"), profile=profile)
    sel = pool.subset(idx)
    t2 = time.perf_counter()
    new_model, last_model, tr = _finetune(model_cur, setup, tests.concat(sel), cfg, derive_seed(seed_r, "finetune"))
    t3 = time.perf_counter()
    rob = _measure(new_model, setup.test, setup.fixed, cfg, derive_seed(seed_r, "measure"))
    last = _last_figures(rob, last_model, setup, cfg, derive_seed(seed_r, "measure"))
    fol_r, conv = _convergence_stat(new_model, setup, cfg, derive_seed(cfg.seed, "probe-attack", r))
    rule = convergence_update(stats + [conv["fol"]["median"]], cfg.convergence_tol, cfg.convergence_patience)
    t4 = time.perf_counter()
    rec = {
        "round": r,
        "pool": {"size": len(pool), "by_method": pool.counts(), "fol": _quantiles(pool.fol)},
        "selected": {"n": len(sel), "budget": cfg.budget, "strategy": cfg.strategy, "by_method": sel.counts(),
                     "fol": _quantiles(sel.fol), "pool_index_sha256": hashlib.sha256(
                         idx.numpy().tobytes()).hexdigest()[:16]},
        "train": tr["history"],
        "robustness": _rob(rob),
        "robustness_last_epoch": last,
        "convergence": {**rule, **conv},
    }
    save_checkpoint(rdir / "model.pt", new_model, metadata={"round": r})
    atomic_save({**sel.payload(), "pool_index": idx}, rdir / "selected.pt")
    atomic_save(fol_r, rdir / "fol.pt")
    atomic_write_json(rdir / "round.json", rec)  # written last: its presence marks the round finished
    tim = {"round": r, "pool_s": t_pool, "select_s": t2 - t1, "finetune_s": t3 - t2, "measure_s": t4 - t3,
           "total_s": time.perf_counter() - t0}
    return rec, new_model, sel, fol_r, tim


# ------------------------------------------------------------------------------------------- compare()
def compare(config: RobotConfig | dict[str, Any], model: nn.Module | None = None) -> dict[str, Any]:
    """Compare selection strategies on ONE pool generated against the original model.

    For every budget in ``config.budgets`` (default ``[config.budget]``), strategy in ``config.strategies``
    (default all of :data:`STRATEGIES`) and seed in ``config.seeds``, the ORIGINAL model is fine-tuned on
    the training data + the selected tests and measured. Writes results.json (with a per (strategy, budget)
    table of means and standard deviations), timings.json, summary.csv and report.html; returns results.
    """
    cfg = config if isinstance(config, RobotConfig) else RobotConfig.from_dict(config)
    if cfg.strategies is None:
        cfg.strategies = list(STRATEGIES)
    cfg.validate()
    out = _prepare_out(cfg, "compare")
    t_start = time.perf_counter()
    setup = _setup(cfg, out, model)
    state = out / "state"
    timings: dict[str, Any] = {"setup": setup.timings, "cells": []}
    budgets = cfg.budgets if cfg.budgets is not None else [cfg.budget]
    strategies = list(cfg.strategies)
    profile = None
    pool_path = state / "pool.pt"
    t0 = time.perf_counter()
    if pool_path.is_file():
        pool = Pool.from_payload(torch.load(pool_path, map_location="cpu", weights_only=True))
    else:
        _log(cfg, f"generating the {cfg.pool} pool from {len(setup.x_fit)} training images")
        if "coverage" in strategies or cfg.pool == "cov-fuzz":
            profile = _coverage_profile(setup.model0, setup.x_fit, cfg)
        pool = generate_pool(setup.model0, setup.x_fit, setup.y_fit, cfg, derive_seed(cfg.seed, "pool"),
                             profile=profile)
        atomic_save(pool.payload(), pool_path)
    timings["pool_s"] = time.perf_counter() - t0
    if len(pool) == 0:
        raise DataError("the test pool is empty (no successful attacks): raise eps or use another pool generator")
    _log(cfg, f"pool: {len(pool)} tests {pool.counts()}")
    cache: dict[str, Any] = {}
    cells: list[dict[str, Any]] = []
    selected_by_strategy: dict[str, torch.Tensor] = {}
    from robustest.runtime import progress as progress_bar

    plan = [(b, s, sd) for b in budgets for s in strategies for sd in cfg.seeds]
    for b, s, sd in progress_bar(plan, enabled=cfg.progress, desc="cells", unit="cell"):
        key = f"{s}_b{str(b).replace('%', 'pct')}_s{sd}"
        cdir = state / "cells" / key
        rec_path = cdir / "cell.json"
        n = parse_budget(b, len(pool))
        if rec_path.is_file():
            rec = json.loads(rec_path.read_text())
            idx = torch.load(cdir / "selected.pt", map_location="cpu", weights_only=True)["pool_index"]
        else:
            if profile is None and s == "coverage" and "bits" not in cache:
                profile = _coverage_profile(setup.model0, setup.x_fit, cfg)
            tc = time.perf_counter()
            cseed = derive_seed(cfg.seed, "cell", s, str(b), sd)
            idx = select_tests(s, setup.model0, pool, n, cfg, derive_seed(cseed, "select"), profile=profile,
                               cache=cache)
            sel = pool.subset(idx)
            new_model, last_model, tr = _finetune(setup.model0, setup, sel, cfg, derive_seed(cseed, "finetune"))
            rob = _measure(new_model, setup.test, setup.fixed, cfg, derive_seed(cfg.seed, "measure-cell", sd))
            last = _last_figures(rob, last_model, setup, cfg, derive_seed(cfg.seed, "measure-cell", sd))
            rec = {"strategy": s, "budget": b, "seed": sd, "n": len(sel), "by_method": sel.counts(),
                   "fol": _quantiles(sel.fol), "train": tr["history"], "robustness": _rob(rob),
                   "robustness_last_epoch": last}
            from robustest.training import save_checkpoint

            save_checkpoint(cdir / "model.pt", new_model, metadata={"strategy": s, "budget": str(b), "seed": sd})
            atomic_save({"pool_index": idx}, cdir / "selected.pt")
            atomic_write_json(rec_path, rec)  # written last: marks the cell finished
            timings["cells"].append({"cell": key, "seconds": time.perf_counter() - tc})
        if sd == cfg.seeds[0] and b == budgets[0]:
            selected_by_strategy[s] = idx
        cells.append(rec)
        rb = rec["robustness"]
        _log(cfg, f"{s:>8} budget {b} ({rec['n']}) seed {sd}: clean {_f(rb['clean_accuracy'])}, "
                  f"fixed-set {_f(rb['fixed_set_accuracy'])}, white-box {_f(rb['whitebox_accuracy'])}")
    table = comparison_table(cells, setup.baseline)
    results = {
        "format": RESULTS_FORMAT, "version": RESULTS_VERSION, "kind": "compare",
        "config": cfg.result_dict(), "data": setup.info, "baseline": _rob(setup.baseline),
        "pool": {"size": len(pool), "by_method": pool.counts(), "fol": _quantiles(pool.fol)},
        "cells": cells, "table": table,
    }
    timings["elapsed_s"] = time.perf_counter() - t_start
    examples = {s: pool.subset(i[: cfg.examples]) for s, i in selected_by_strategy.items()}
    _write_outputs(out, results, timings, setup, cfg, fol_by_round=None, examples=None,
                   compare_data={"pool": pool, "examples": examples, "selected": selected_by_strategy})
    return results


def comparison_table(cells: list[dict[str, Any]], baseline: RobustnessReport | dict[str, Any]
                     ) -> list[dict[str, Any]]:
    """Aggregate comparison cells into one row per (strategy, budget): mean and standard deviation over
    seeds of each robustness figure (``*_mean``/``*_std``), plus the original model's figures (``before_*``)."""
    base = baseline.to_dict() if isinstance(baseline, RobustnessReport) else baseline
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["strategy"], str(c["budget"])), []).append(c)
    rows = []
    for (s, b), cs in groups.items():
        row: dict[str, Any] = {"strategy": s, "budget": b, "n": cs[0]["n"], "seeds": len(cs)}
        for m in ("fixed_set_accuracy", "whitebox_accuracy", "clean_accuracy"):
            row[f"before_{m}"] = base.get(m)
            vals = [c["robustness"].get(m) for c in cs]
            vals = [v for v in vals if v is not None]
            row[f"{m}_mean"] = float(np.mean(vals)) if vals else None
            row[f"{m}_std"] = float(np.std(vals, ddof=1)) if len(vals) > 1 else (0.0 if vals else None)
        lv = [c["robustness_last_epoch"].get("fixed_set_accuracy") for c in cs]
        lv = [v for v in lv if v is not None]
        row["last_epoch_fixed_set_accuracy_mean"] = float(np.mean(lv)) if lv else None
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------- outputs
def _write_outputs(out: Path, results: dict[str, Any], timings: dict[str, Any], setup: _Setup, cfg: RobotConfig,
                   *, fol_by_round: dict[int, torch.Tensor] | None, examples: Pool | None,
                   compare_data: dict[str, Any] | None) -> None:
    from robustest.report import write_csv

    atomic_write_json(out / "results.json", results)
    atomic_write_json(out / "timings.json", timings)
    if results["kind"] == "loop":
        rows = [_summary_row(0, results["baseline"], None, None)]
        for rec in results["rounds"]:
            rows.append(_summary_row(rec["round"], rec["robustness"], rec, rec["robustness_last_epoch"]))
        write_csv(out / "summary.csv", rows)
    else:
        write_csv(out / "summary.csv", results["table"])
    try:
        _write_report(out, results, setup, cfg, fol_by_round, examples, compare_data)
    except ImportError as exc:  # matplotlib missing: results stay valid
        _log(cfg, f"report.html skipped: {exc}")


def _summary_row(r: int, rob: dict[str, Any], rec: dict[str, Any] | None, last: dict[str, Any] | None
                 ) -> dict[str, Any]:
    return {"round": r, "pool": rec["pool"]["size"] if rec else None, "selected": rec["selected"]["n"] if rec else 0,
            "clean_accuracy": rob["clean_accuracy"], "fixed_set_accuracy": rob["fixed_set_accuracy"],
            "whitebox_pgd_accuracy": rob["whitebox_pgd_accuracy"],
            "whitebox_apgd_accuracy": rob["whitebox_apgd_accuracy"], "whitebox_accuracy": rob["whitebox_accuracy"],
            "last_epoch_fixed_set_accuracy": last["fixed_set_accuracy"] if last else None,
            "median_fol": rec["convergence"]["statistic"] if rec else None,
            "fol_rel_change": rec["convergence"]["rel_change"] if rec else None}


def _write_report(out: Path, results: dict[str, Any], setup: _Setup, cfg: RobotConfig,
                  fol_by_round: dict[int, torch.Tensor] | None, examples: Pool | None,
                  compare_data: dict[str, Any] | None) -> None:
    from robustest.report import HtmlReport, save_bars, save_histogram, save_image_grid, save_lines

    d = results["data"]
    rep = HtmlReport("RobOT: robustness-oriented testing and retraining" if results["kind"] == "loop"
                     else "RobOT: selection strategy comparison")
    rep.paragraph(f"Model {d['model'].get('name')} on {d['dataset']}: {d['num_fit']} training images for "
                  f"fine-tuning, {d['num_val']} validation images (checkpoint selection), {d['num_test']} test "
                  f"images. eps = {cfg.eps} (L-inf). Fixed adversarial set: {d['fixed_set']['size']} successful "
                  f"FGSM/PGD examples of the test split against the original model {d['fixed_set']['by_attack']}.")
    n_wb = d["num_test"] if cfg.whitebox_limit is None else min(cfg.whitebox_limit, d["num_test"])
    rep.paragraph("Robustness measures: clean accuracy; accuracy on the fixed adversarial set (the paper's "
                  "measure; 0 for the original model); white-box accuracy of the retrained model itself "
                  f"(per-sample worst case of PGD {cfg.whitebox_pgd_steps} steps x {cfg.whitebox_restarts} "
                  f"restarts and APGD-CE {cfg.apgd_steps} steps, first {n_wb} test images).")
    base = results["baseline"]
    if results["kind"] == "loop":
        rounds = results["rounds"]
        rep.heading("Robustness per round")
        rep.paragraph(f"Strategy {cfg.strategy}, budget {cfg.budget} per round, pool {cfg.pool}. "
                      f"Stopped: {results['stop_reason']} after {results['rounds_completed']} round(s).")
        xs = list(range(len(rounds) + 1))
        series = {}
        for m, label in (("clean_accuracy", "clean"), ("fixed_set_accuracy", "fixed set"),
                         ("whitebox_accuracy", "white-box")):
            ys = [base.get(m)] + [rec["robustness"].get(m) for rec in rounds]
            if all(v is not None for v in ys):
                series[label] = (xs, ys)
        if series:
            rep.image(save_lines(series, None, title="robustness per round", xlabel="round", ylabel="accuracy"),
                      "accuracy per round (round 0 = original model)")
        rows = []
        rows.append({"round": 0, "pool": "-", "selected": 0, **{k: base.get(k) for k in METRICS}, "median FOL":
                     results["convergence_rule"]["round0"]["fol"]["median"], "rel. change": None})
        for rec in rounds:
            rows.append({"round": rec["round"], "pool": rec["pool"]["size"], "selected": rec["selected"]["n"],
                         **{k: rec["robustness"].get(k) for k in METRICS},
                         "median FOL": rec["convergence"]["statistic"],
                         "rel. change": rec["convergence"]["rel_change"]})
        rep.table(rows)
        if fol_by_round:
            rep.heading("FOL distribution of fresh PGD tests per round")
            rep.paragraph(f"Convergence rule: stop when the median FOL changes by less than {cfg.convergence_tol:g} "
                          f"(relative) for {cfg.convergence_patience} consecutive rounds.")
            rep.image(save_histogram({f"round {r}": v for r, v in sorted(fol_by_round.items())}, None,
                                     title="FOL of fresh PGD tests", xlabel="FOL", bins=40),
                      "FOL per round (lower and more concentrated = closer to convergence)")
        if examples is not None and len(examples):
            k = min(cfg.examples, len(examples))
            rep.heading("Example selected tests")
            rep.image(save_image_grid(examples.x[:k], None, captions=[
                f"y={int(examples.y[i])} FOL={float(examples.fol[i]):.3g}" for i in range(k)]), "first selected tests")
    else:
        table = results["table"]
        rep.heading("Robustness per strategy and budget (mean ± std over seeds)")
        cols = ["strategy", "budget", "n", "seeds", "before_fixed_set_accuracy", "fixed_set_accuracy_mean",
                "fixed_set_accuracy_std", "before_whitebox_accuracy", "whitebox_accuracy_mean",
                "whitebox_accuracy_std", "clean_accuracy_mean", "last_epoch_fixed_set_accuracy_mean"]
        rep.table(table, cols)
        for m, label in (("fixed_set_accuracy", "fixed-set accuracy"), ("whitebox_accuracy", "white-box accuracy")):
            groups: dict[str, dict[str, float]] = {}
            errs: dict[str, dict[str, float]] = {}
            if base.get(m) is not None:
                groups["original model"] = {str(row["budget"]): base[m] for row in table}
            for row in table:
                if row.get(f"{m}_mean") is None:
                    continue
                groups.setdefault(row["strategy"], {})[str(row["budget"])] = row[f"{m}_mean"]
                errs.setdefault(row["strategy"], {})[str(row["budget"])] = row[f"{m}_std"] or 0.0
            if groups:
                rep.image(save_bars(groups, None, title=f"{label} after retraining", ylabel="accuracy", errors=errs),
                          f"{label} per strategy (x axis: budget; original model: {base.get(m)})")
        assert compare_data is not None
        pool: Pool = compare_data["pool"]
        rep.heading("FOL distribution of the pool and of each strategy's selection")
        rep.image(save_histogram({"pool": pool.fol}, None, title="FOL of the pool", xlabel="FOL", bins=40),
                  "FOL of all pool tests")
        sel_fol = {s: pool.fol[i] for s, i in compare_data["selected"].items() if len(i)}
        if sel_fol:
            rep.image(save_histogram(sel_fol, None, title="FOL of the selected tests", xlabel="FOL", bins=40),
                      "FOL of the tests each strategy selected (first budget, first seed)")
        for s, ex in compare_data["examples"].items():
            if len(ex):
                rep.heading(f"Example tests selected by {s}", level=3)
                rep.image(save_image_grid(ex.x, None, captions=[
                    f"y={int(ex.y[i])} FOL={float(ex.fol[i]):.3g}" for i in range(len(ex))]),
                    f"first {len(ex)} tests selected by {s}")
    rep.heading("Settings")
    rep.preformatted(json.dumps(results["config"], indent=1, default=str))
    rep.write(out / "report.html")

