"""Settings of a RobOT run or comparison (:class:`RobotConfig`, validated up front), budgets and the
seeds every unit of work derives from."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from robustest import data as datasets
from robustest import selection
from robustest.core.errors import ConfigError
from robustest.core.options import option
from robustest.core.validation import (
    check_bool,
    check_eps,
    check_float,
    check_int,
    check_keywords,
    check_seed,
    check_str,
)
from robustest.train import objectives
from robustest.train.hardening import HARDEN_RECIPE_FIELDS
from robustest.train.recipes import Recipe

#: the largest config file read (a run config is a few hundred bytes; YAML's parser needs about 2 kB of memory per
#: byte of a file of many keys, so a file of 800,000 keys would take 1.5 GB before its keys were refused)
MAX_CONFIG_BYTES = 2**20
POOLS = ("attack", "fol-fuzz", "cov-fuzz")
#: robot's name of a hardening objective where it differs from the objective's (adv-train is Madry's PGD-AT)
_STRATEGY_NAMES = {"pgd-at": "adv-train"}


class _HardenStrategies(Mapping[str, str]):
    """Strategy name -> the harden method it runs, read from the objectives' registry at every use (so an
    objective registered after robustest.robot was imported is a strategy too)."""

    def _now(self) -> dict[str, str]:
        return {_STRATEGY_NAMES.get(m, m): m for m in objectives.names()}

    def __getitem__(self, key: str) -> str:
        return self._now()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())


class _BudgetFree(Mapping[str, str]):
    """Strategy -> the budget label of the strategies that select nothing from a budget (live, as above)."""

    def _now(self) -> dict[str, str]:
        return {"all": "100%", **{s: "online" for s in HARDEN_STRATEGIES}}

    def __getitem__(self, key: str) -> str:
        return self._now()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())


#: retraining by adversarial training against the current model (robustest.train.harden), as strategies: one per
#: registered harden method (robustest.train.objectives), mapped to the objective it runs
HARDEN_STRATEGIES: Mapping[str, str] = _HardenStrategies()
#: scores of the model under test that a run ranks with one of the selection registry's plain rankings (gini:
#: the highest DeepGini scores first, robustest.selection's ``top``)
RANKED_SCORES = {"gini": "top"}
#: what ``compare`` runs when no strategies are given (the paper's strategies, random and coverage)
DEFAULT_STRATEGIES = ("best", "kmst", "gini", "random", "coverage")
#: strategies that select nothing from a budget: ``all`` takes the whole pool, ``adv-train`` fine-tunes on PGD
#: examples generated against the current model every batch (Madry et al.) and uses no pool; a comparison runs
#: them once per seed, under the budget label of BUDGET_FREE
BUDGET_FREE: Mapping[str, str] = _BudgetFree()
#: finetune_options adv-train and the other hardening strategies honour (robustest.train.harden's recipe); left
#: unset, the schedule is constant and eps is not warmed up (the cells' settings since the first release)
ADV_TRAIN_OPTIONS = (*(k for k in HARDEN_RECIPE_FIELDS if k != "lr"), "eps_warmup")
METRICS = ("clean_accuracy", "fixed_set_accuracy", "whitebox_accuracy", "whitebox_pgd_accuracy",
           "whitebox_apgd_accuracy", "autoattack_accuracy")
#: versions of robustest.evaluate's ensemble a run may add to every measurement (config key ``autoattack``)
AUTOATTACK_VERSIONS = ("fast", "standard")
# config keys that do not change results (left out of results.json and of the resume check)
_RUNTIME_KEYS = ("out", "resume", "progress", "verbose", "device", "workers")
# keys a resumed run may change: they decide how many rounds/cells run, not what a finished one contains
# paths whose CONTENT a resumed run checks (model weights and data are fingerprinted), so a moved file is fine
PATH_KEYS = ("model", "weights", "data_dir")
# recipe options of robustest.train.fit a config may give for training the original model / fine-tuning
FIT_OPTION_KEYS = tuple(f.name for f in fields(Recipe) if f.name != "lr")
EXTENDABLE_KEYS = ("rounds", "time_budget", "target", "target_metric", "strategies", "budgets", "seeds", "examples")


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
    Selection: ``strategy`` (loop; default adv-train, see docs/RESULTS.md "Does regenerating the pool every
    round pay") or ``strategies`` (comparison) from best, kmst, gini, random, coverage,
    stratified (``stratified_bins`` FOL-quantile bins x class), fol-prop (probability proportional to FOL),
    kcenter (k-center greedy on penultimate-layer features), and the baselines all (the whole pool) and
    adv-train (PGD adversarial training against the current model, no pool); ``budget`` (loop) or ``budgets``
    (comparison): a count (int) or a percentage of the pool ("5%").
    Fine-tuning: ``epochs``, ``batch_size``, ``lr`` (Adam), validation split ``val_fraction`` of the
    training data (plus its adversarial examples when ``val_adversarial``). ``finetune_options``: further
    recipe options of :func:`robustest.train.fit` for fine-tuning (``schedule``, ``milestones``,
    ``augment``, ``weight_decay``, ``optimizer``, ``amp``, ...); ``train_options``: the same, plus ``lr`` and
    ``batch_size``, for training ``train_model`` (default: Adam with ``lr`` and ``batch_size``).
    Loop: ``rounds``, ``time_budget`` (seconds), ``target`` (stop once ``target_metric`` >= target),
    convergence rule ``convergence_tol``/``convergence_patience``/``convergence_probe``.
    Measurement: ``whitebox`` (on the first ``whitebox_limit`` test images), PGD steps/restarts, APGD steps,
    ``autoattack`` (None, "fast" or "standard": also :func:`robustest.evaluate.evaluate`'s ensemble on the same
    images, recorded as ``autoattack_accuracy``), ``corruptions`` (None, "all" or a list).
    ``seeds``: comparison seeds; ``seed``: everything else.
    """

    model: str | None = option(None, "text", "model.pt from 'robustest train', a .pt2 program, or a TorchScript "
                               "archive with --torchscript; with --model: that model's weights", metavar="FILE",
                               flag="checkpoint", shown="train --train-model on the data first")
    model_factory: str | None = option(None, "text", "build the model by calling your function or class (imported "
                                       "from PYTHONPATH or the current folder): this RUNS YOUR CODE",
                                       metavar="PKG.MODULE:FACTORY", flag="model")
    model_args: dict[str, Any] | None = option(None, "json", "keyword arguments for --model (JSON)", metavar="JSON")
    weights: str | None = option(None, "text", "state_dict for --model (torch.load weights_only=True)", metavar="FILE")
    torchscript: bool = option(False, "flag", "accept a TorchScript archive as --checkpoint: it RUNS CODE from the "
                               "file, so only from a source you trust")
    train_model: str = option("digits_cnn", "text", "zoo model trained when no checkpoint is given", metavar="NAME")
    train_epochs: int = option(30, "positive-int", "epochs for that training", metavar="N")
    dataset: str = option("digits", "text", "data set name", metavar="NAME")
    data_dir: str | None = option(None, "text", "folder or file holding the data; not needed for digits",
                                  metavar="DIR")
    train_limit: int | None = option(None, "positive-int", "use only the first N training images", metavar="N")
    test_limit: int | None = option(None, "positive-int", "use only the first N test images", metavar="N")
    eps: float = option(0.3, "linf-eps", "L-inf radius in pixel scale")
    pool: str = option("attack", "choice", "test generator: FGSM+PGD on the training set (attack), FOL or coverage "
                       "fuzzing", choices=POOLS)
    pool_limit: int | None = option(None, "positive-int", "generate tests from N training images", metavar="N")
    pool_pgd_steps: int = 10
    fuzz_options: dict[str, Any] = field(default_factory=dict)
    strategy: str = option("adv-train", "choice", "strategy: a selection strategy (random, best, ...) selects "
                           "--budget tests from a fresh pool every round; all: the whole pool every round; trades, "
                           "fosc, fol-budget, fast-at: the other methods of 'robustest harden', as adv-train",
                           choices=lambda: strategies(), shown="adv-train: PGD adversarial training against the "
                           "current model, no pool")
    strategies: list[str] | None = None
    budget: int | str = "5%"
    budgets: list[int | str] | None = None
    kmst_k: int = 4
    stratified_bins: int = 4
    coverage_metric: str = "kmnc"
    coverage_options: dict[str, Any] = field(default_factory=dict)
    coverage_profile_limit: int = 2000
    epochs: int = option(10, "positive-int", "fine-tuning epochs")
    batch_size: int = option(64, "positive-int", "fine-tuning batch size")
    lr: float = option(1e-3, "rate", "fine-tuning learning rate, Adam")
    train_options: dict[str, Any] = option(dict, "json", "training recipe of --train-model: options of "
                                           "robustest.train.fit plus lr and batch_size, e.g. '{\"optimizer\": "
                                           "\"sgd\", \"lr\": 0.1, \"schedule\": \"cosine\"}'", metavar="JSON")
    finetune_options: dict[str, Any] = option(dict, "json", "further fit options for fine-tuning, e.g. "
                                              "'{\"schedule\": \"step\", \"augment\": \"crop-flip\"}'",
                                              metavar="JSON")
    val_fraction: float = 0.1
    val_adversarial: bool = True
    rounds: int = option(3, "positive-int", "maximum number of rounds")
    time_budget: float | None = option(None, "positive", "stop starting rounds after this", metavar="SECONDS")
    target_metric: str = option("whitebox_accuracy", "choice", "robustness figure the requirement is on",
                                choices=METRICS)
    target: float | None = option(None, "unit", "stop once --target-metric reaches this accuracy in [0, 1]")
    convergence_tol: float = option(0.05, "non-negative", "relative change of the median FOL")
    convergence_patience: int = option(2, "positive-int", "rounds below the tolerance")
    convergence_probe: int = 500
    whitebox: bool = option(True, "switch", "the white-box measurement")
    whitebox_limit: int | None = option(1000, "positive-int", "white-box attacks on the first N test images",
                                        metavar="N")
    whitebox_pgd_steps: int = 20
    whitebox_restarts: int = 2
    apgd_steps: int = 50
    whitebox_last: bool = False
    autoattack: str | None = option(None, "choice", "also measure robust accuracy under the AutoAttack-style "
                                    "ensemble of 'robustest eval' on the white-box images, in every measurement "
                                    "(fast: APGD-CE + APGD-T on 3 classes; standard: AutoAttack's standard version)",
                                    choices=AUTOATTACK_VERSIONS, shown="off")
    corruptions: str | list[str] | None = None
    seeds: list[int] = field(default_factory=lambda: [0])
    seed: int = option(0, "seed", "random seed")
    examples: int = 16
    device: str | None = option(None, "text", "cpu, cuda, cuda:N or auto", metavar="D", shown="cpu")
    workers: int = option(0, "count", "worker processes decoding the data set when it is read", metavar="N",
                          shown="0, the main process")
    out: str = option("robot-out", "text", "output folder", metavar="DIR")
    resume: bool = option(False, "flag", "continue the run saved in --out")
    progress: bool = False
    verbose: bool = True

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, d: dict[str, Any], validate: bool = True) -> RobotConfig:
        """Build and validate a config from a plain dict; unknown keys are a one-line ConfigError.
        ``validate=False`` checks the keys only (for a file that flags complete before the whole is validated)."""
        if not isinstance(d, dict):
            raise ConfigError(f"a RobOT config must be a mapping of settings, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        norm = {str(k).replace("-", "_"): v for k, v in d.items()}
        unknown = sorted(set(norm) - known)
        if unknown:
            raise ConfigError(f"unknown config key {unknown[0]!r}: valid keys are {', '.join(sorted(known))}")
        cfg = cls(**norm)
        if validate:
            cfg.validate()
        return cfg

    @classmethod
    def from_yaml(cls, path: str | Path, validate: bool = True) -> RobotConfig:
        """Read a YAML (or JSON) config file; see :meth:`from_dict`."""
        return cls.from_dict(read_config(path), validate=validate)

    @classmethod
    def layered(cls, path: str | Path | Mapping[str, Any] | None = None, defaults: dict[str, Any] | None = None,
                overrides: dict[str, Any] | None = None) -> RobotConfig:
        """A validated config from three layers: the file at ``path`` (YAML or JSON, if given; or its content, a
        mapping already read), then ``defaults`` for the keys the file does not set, then ``overrides`` (a command's
        flags: None values are not given)."""
        d: dict[str, Any] = dict(defaults or {})
        if path is not None:
            raw = dict(path) if isinstance(path, Mapping) else read_config(path)  # read once: keys and values
            given = {str(k).replace("-", "_") for k in raw}
            d = {**cls.from_dict(raw, validate=False).to_dict(),  # validated once the overrides are in
                 **{k: v for k, v in d.items() if k not in given}}
        d.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def result_dict(self) -> dict[str, Any]:
        """The settings that determine the results (runtime-only keys left out)."""
        return {k: v for k, v in self.to_dict().items() if k not in _RUNTIME_KEYS}

    # ------------------------------------------------------------------ validation
    def _check_types(self) -> None:
        """Every key against its declared type, before any range check: a YAML ``"no"`` is not a boolean, ``5``
        is not a path, ``3.0`` is not an integer; numbers are finite; mapping options name real parameters."""
        for f in fields(self):
            v = getattr(self, f.name)
            ann = str(f.type).replace(" ", "")
            if v is None:
                if ann.endswith("|None"):
                    continue
                raise ConfigError(f"{f.name} must be set (null is not allowed), got null")
            base = ann[:-len("|None")] if ann.endswith("|None") else ann
            if base == "bool":
                check_bool(f.name, v)
            elif base == "str":
                check_str(f.name, v)
            elif base == "int":
                check_int(f.name, v)
            elif base == "float":
                check_float(f.name, v)
            elif base.startswith("dict"):
                if not isinstance(v, dict):
                    raise ConfigError(f"{f.name} must be a mapping of settings, got {v!r}")
            elif base == "int|str":
                if isinstance(v, bool) or not isinstance(v, (int, str)):
                    raise ConfigError(f"{f.name} must be a count or a percentage such as '5%', got {v!r}")
            elif base.startswith("list") or base == "str|list[str]":
                items = [v] if isinstance(v, str) and base == "str|list[str]" else v
                if not isinstance(items, (list, tuple)):
                    raise ConfigError(f"{f.name} must be a list, got {v!r}")
                for i, item in enumerate(items):
                    if "int" in base and "str" not in base:
                        check_int(f"{f.name}[{i}]", item)
                    elif isinstance(item, bool) or not isinstance(item, (str, int)):
                        raise ConfigError(f"{f.name}[{i}] must be a name or a count, got {item!r}")
        from robustest.fuzzing import coverage_fuzz, fol_fuzz

        if self.pool == "fol-fuzz":
            check_keywords("fuzz_options", self.fuzz_options, fol_fuzz, exclude=("model", "x", "y", "seed"))
        elif self.pool == "cov-fuzz":
            check_keywords("fuzz_options", self.fuzz_options, coverage_fuzz,
                           exclude=("model", "x", "y", "profile", "seed", "metric"))
        elif self.fuzz_options:
            raise ConfigError(f"fuzz_options apply to pool fol-fuzz or cov-fuzz, not {self.pool!r}: drop them")
        allowed = {"k", "threshold", "top_k", "scale"}
        unknown = sorted(set(self.coverage_options) - allowed)
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r} in coverage_options: valid keys are "
                              f"{', '.join(sorted(allowed))}")

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """A JSON Schema (draft 2020-12) of run.yaml/compare configs: every key with its type, choices and
        default, and the help of a key that is also a flag (docs/schemas/config/run.schema.json is this, written
        out)."""
        from robustest.metrics import names as metric_names

        choices = {"pool": list(POOLS), "strategy": list(strategies()), "target_metric": list(METRICS),
                   "autoattack": list(AUTOATTACK_VERSIONS),
                   "coverage_metric": metric_names("coverage")}
        types = {"bool": {"type": "boolean"}, "str": {"type": "string", "minLength": 1},
                 "int": {"type": "integer"}, "float": {"type": "number"}, "dict[str,Any]": {"type": "object"},
                 "int|str": {"type": ["integer", "string"]},
                 "list[str]": {"type": "array", "items": {"type": "string"}},
                 "list[int]": {"type": "array", "items": {"type": "integer"}},
                 "list[int|str]": {"type": "array", "items": {"type": ["integer", "string"]}},
                 "str|list[str]": {"type": ["string", "array"], "items": {"type": "string"}}}
        props: dict[str, Any] = {}
        defaults = cls().to_dict()
        for f in fields(cls):
            ann = str(f.type).replace(" ", "")
            nullable = ann.endswith("|None")
            base = ann[:-len("|None")] if nullable else ann
            s = dict(types.get(base, {}))
            if f.name in choices:
                s = {"enum": choices[f.name]}
            if nullable:
                s = {"anyOf": [s, {"type": "null"}]}
            s["default"] = defaults[f.name]
            if "help" in f.metadata:
                s["description"] = f.metadata["help"]
            props[f.name] = s
        return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "robustest run/compare config",
                "type": "object", "properties": props, "additionalProperties": False}

    def validate(self) -> RobotConfig:
        """Check every setting; raises ConfigError with a one-line message naming the key and the fix."""
        self._check_types()
        self._check_model()
        self._check_data_and_pool()
        hard = self._check_strategies()
        self._check_training(hard)
        self._check_loop()
        self._check_measurement()
        self._check_seeds_and_output()
        return self

    def _pos_int(self, name: str, allow_none: bool = False, minimum: int = 1) -> None:
        v = getattr(self, name)
        if v is None and allow_none:
            return
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
            raise ConfigError(f"{name} must be an integer >= {minimum}, got {v!r}")

    def _number(self, name: str, lo: float, hi: float, allow_none: bool = False, lo_open: bool = True) -> None:
        v = getattr(self, name)
        if v is None and allow_none:
            return
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
                (v <= lo if lo_open else v < lo) or v > hi:
            raise ConfigError(f"{name} must be a number in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")

    def _check_model(self) -> None:
        """The model to test (checkpoint, factory and weights, or the zoo model to train) and its files."""
        if self.model is not None and not isinstance(self.model, str):
            raise ConfigError(f"model must be a checkpoint path, got {self.model!r}")
        if self.model_factory is not None and (not isinstance(self.model_factory, str)
                                               or self.model_factory.count(":") != 1):
            raise ConfigError(f"model_factory must be 'package.module:function', got {self.model_factory!r}")
        if self.model_args is not None and not isinstance(self.model_args, dict):
            raise ConfigError(f"model_args must be a mapping of keyword arguments, got {self.model_args!r}")
        if self.model_args is not None and self.model_factory is None:
            raise ConfigError("model_args applies to model_factory: name the factory too")
        if self.weights is not None and (not isinstance(self.weights, str) or self.model_factory is None):
            raise ConfigError("weights is a state_dict path for model_factory: name the factory too")
        if not isinstance(self.torchscript, bool):
            raise ConfigError(f"torchscript must be true or false, got {self.torchscript!r}")
        for key in ("model", "weights"):
            path = getattr(self, key)
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"{key} {path!r} does not exist: pass an existing file")
        if self.data_dir is not None and (not isinstance(self.data_dir, str) or not Path(self.data_dir).exists()):
            raise ConfigError(f"data_dir {self.data_dir!r} does not exist: pass the folder or file holding the data")
        from robustest import models as zoo

        try:
            zoo.resolve_name(self.train_model)
        except ConfigError as exc:
            raise ConfigError(f"train_model: {exc}") from exc

    def _check_data_and_pool(self) -> None:
        """The data set, its limits, eps and the pool generator."""
        if self.dataset not in datasets.names():
            raise ConfigError(f"unknown dataset {self.dataset!r}: choose one of {', '.join(datasets.names())}")
        self._pos_int("train_epochs", minimum=0)
        self._pos_int("train_limit", allow_none=True)
        self._pos_int("test_limit", allow_none=True)
        check_eps("eps", self.eps)
        if self.pool not in POOLS:
            raise ConfigError(f"unknown pool {self.pool!r}: use one of {', '.join(POOLS)}")
        self._pos_int("pool_limit", allow_none=True)
        self._pos_int("pool_pgd_steps")
        for name in ("fuzz_options", "coverage_options"):
            if not isinstance(getattr(self, name), dict):
                raise ConfigError(f"{name} must be a mapping of keyword arguments, got {getattr(self, name)!r}")

    def _check_strategies(self) -> list[str]:
        """Strategy or strategies, budget or budgets, the selection parameters and the options the hardening
        strategies take; returns the hardening strategies in use."""
        known = strategies()
        if self.strategy not in known:
            raise ConfigError(f"unknown strategy {self.strategy!r}: choose one of {', '.join(known)}")
        if self.strategies is not None:
            if not isinstance(self.strategies, (list, tuple)) or not self.strategies:
                raise ConfigError(f"strategies must be a non-empty list, e.g. [best, kmst, gini, random], "
                                  f"got {self.strategies!r}")
            for s in self.strategies:
                if s not in known:
                    raise ConfigError(f"unknown strategy {s!r} in strategies: choose from {', '.join(known)}")
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
        self._pos_int("kmst_k")
        self._pos_int("stratified_bins")
        used = list(self.strategies) if self.strategies is not None else [self.strategy]
        hard = [s for s in used if s in HARDEN_STRATEGIES]
        if hard:
            extra = sorted(set(self.finetune_options) - set(ADV_TRAIN_OPTIONS))
            if extra:
                raise ConfigError(f"finetune_options: {hard[0]} fine-tunes with robustest.train.harden, which "
                                  f"takes only {' and '.join(ADV_TRAIN_OPTIONS)}, not {extra[0]!r}: drop it, or "
                                  f"choose a selection strategy instead of {hard[0]} (the loop's default), e.g. "
                                  "random")
            if self.finetune_options.get("optimizer", "adam") not in ("adam", "sgd"):
                raise ConfigError(f"finetune_options: {hard[0]} takes optimizer adam or sgd, got "
                                  f"{self.finetune_options['optimizer']!r}")
        return hard

    def _check_training(self, hard: list[str]) -> None:
        """Coverage, fine-tuning and training settings (``hard``: the hardening strategies in use)."""
        if self.coverage_metric not in ("nc", "kmnc", "nbc", "snac", "tknc"):
            raise ConfigError(f"unknown coverage_metric {self.coverage_metric!r}: use nc, kmnc, nbc, snac or tknc")
        self._pos_int("coverage_profile_limit")
        self._pos_int("epochs")
        self._pos_int("batch_size")
        self._number("lr", 0.0, 10.0)
        self._check_fit_options("train_options", self.train_epochs, ("lr", "batch_size"))
        self._check_fit_options("finetune_options", self.epochs, ("eps_warmup",))
        if "eps_warmup" in self.finetune_options:
            if not hard:
                raise ConfigError("finetune_options: eps_warmup applies to the hardening strategies "
                                  f"({', '.join(HARDEN_STRATEGIES)}) only")
            check_float("finetune_options: eps_warmup", self.finetune_options["eps_warmup"], 0.0, 1.0, hi_open=True)
        if self.model is None and self.model_factory is None:
            from robustest import models as zoo

            shape = datasets.info(self.dataset).shape
            if shape is not None:  # a built-in shape: the zoo model must take it, checked before any data loads
                try:
                    zoo.check_input(self.train_model, shape[0], shape[1], datasets.info(self.dataset).num_classes)
                except ConfigError as exc:
                    raise ConfigError(f"train_model on {self.dataset}: {exc}") from exc
        self._number("val_fraction", 0.0, 0.5)

    def _check_loop(self) -> None:
        """Rounds, time budget, target and the convergence rule of the loop."""
        self._pos_int("rounds")
        self._number("time_budget", 0.0, float("inf"), allow_none=True)
        if self.target_metric not in METRICS:
            raise ConfigError(f"unknown target_metric {self.target_metric!r}: use one of {', '.join(METRICS)}")
        self._number("target", 0.0, 1.0, allow_none=True, lo_open=False)
        if self.target is not None and self.target_metric == "autoattack_accuracy" and self.autoattack is None:
            raise ConfigError("target_metric autoattack_accuracy needs autoattack set: add autoattack: fast or "
                              "standard (--autoattack)")
        self._number("convergence_tol", 0.0, float("inf"), lo_open=False)
        self._pos_int("convergence_patience")
        self._pos_int("convergence_probe")

    def _check_measurement(self) -> None:
        """White-box attack settings and the AutoAttack ensemble."""
        self._pos_int("whitebox_limit", allow_none=True)
        self._pos_int("whitebox_pgd_steps")
        self._pos_int("whitebox_restarts")
        self._pos_int("apgd_steps", minimum=0)
        if self.autoattack is not None and self.autoattack not in AUTOATTACK_VERSIONS:
            raise ConfigError(f"unknown autoattack {self.autoattack!r}: use fast or standard (or leave it unset)")
        if self.autoattack is not None and not self.whitebox:
            raise ConfigError("autoattack runs on the white-box images: drop --no-whitebox (whitebox: false) or "
                              "autoattack")

    def _check_seeds_and_output(self) -> None:
        """Seeds, example count, workers, corruptions and the output folder."""
        if not isinstance(self.seeds, (list, tuple)) or not self.seeds:
            raise ConfigError(f"seeds must be a non-empty list of seeds (integers in [0, 2^63)), got {self.seeds!r}")
        self.seeds = [check_seed(f"seeds[{i}]", s) for i, s in enumerate(self.seeds)]
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("seeds lists a seed twice: name each once")
        check_seed("seed", self.seed)
        self._pos_int("examples", minimum=0)
        self._pos_int("workers", minimum=0)
        if self.corruptions is not None and not isinstance(self.corruptions, (str, list)):
            raise ConfigError(f"corruptions must be null, 'all' or a list of names, got {self.corruptions!r}")
        if not isinstance(self.out, str) or not self.out:
            raise ConfigError(f"out must be a folder path, got {self.out!r}")

    def finetune_recipe(self) -> Recipe:
        """The recipe the cells fine-tune with (:class:`robustest.train.recipes.Recipe`): Adam at ``lr`` unless
        ``finetune_options`` set other recipe options (its ``eps_warmup`` is harden's, not the recipe's)."""
        return Recipe(lr=self.lr, **{k: v for k, v in self.finetune_options.items() if k in FIT_OPTION_KEYS})

    def train_recipe(self) -> Recipe:
        """The recipe ``train_model`` is trained with: ``train_options``' recipe options, its ``lr`` (default: the
        config's ``lr``); its ``batch_size`` is the fit's own."""
        opts = self.train_options
        return Recipe(lr=opts.get("lr", self.lr), **{k: v for k, v in opts.items() if k in FIT_OPTION_KEYS})

    def _check_fit_options(self, name: str, epochs: int, extra: tuple[str, ...]) -> None:
        opts = getattr(self, name)
        if not isinstance(opts, dict):
            raise ConfigError(f"{name} must be a mapping of training options, got {opts!r}")
        unknown = sorted(set(opts) - set(FIT_OPTION_KEYS) - set(extra))
        if unknown:
            raise ConfigError(f"{name}: unknown option {unknown[0]!r}: valid options are "
                              f"{', '.join(sorted((*FIT_OPTION_KEYS, *extra)))}")
        if "batch_size" in opts:
            v = opts["batch_size"]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name}: batch_size must be an integer >= 1, got {v!r}")
        try:
            (self.train_recipe() if name == "train_options" else self.finetune_recipe()).check(max(int(epochs), 1))
        except ConfigError as exc:
            raise ConfigError(f"{name}: {exc}") from exc


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


def selection_strategies() -> tuple[str, ...]:
    """The pool-selection strategies of a run or comparison, read from :mod:`robustest.selection`'s registry
    (in its order, so a registered strategy is accepted too): each gets the pool's FOL, the coverage bits or the
    penultimate-layer features, as it declares it needs; a plain ranking (``top``, ``bottom``) is offered only
    under the name of a score it ranks (:data:`RANKED_SCORES`)."""
    out: list[str] = []
    for name in selection.names():
        if selection.get(name).ranking:
            out.extend(score for score, ranking in RANKED_SCORES.items() if ranking == name)
        else:
            out.append(name)
    return tuple(out)


def strategies() -> tuple[str, ...]:
    """Every strategy a run or comparison accepts: :func:`selection_strategies`, the whole pool (``all``) and the
    hardening strategies (:data:`HARDEN_STRATEGIES`)."""
    return (*selection_strategies(), "all", *HARDEN_STRATEGIES)


def read_config(path: str | Path) -> dict[str, Any]:
    """The mapping of a YAML (or JSON) config file, read only when it is a regular file of at most
    :data:`MAX_CONFIG_BYTES` (refused before parsing otherwise); one-line :class:`ConfigError` for a missing,
    binary, oversized or malformed file, or one that is not a mapping of keys."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist: pass a YAML file with --config")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is {size:,} bytes, more than the {MAX_CONFIG_BYTES:,} a config may "
                          "have: a run config holds a few keys (see docs/RESULTS_SCHEMA.md)")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:  # grew since it was measured
            raise ConfigError(f"config file {path} is more than the {MAX_CONFIG_BYTES:,} bytes a config may have")
        d = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not text (a binary byte at offset {exc.start}): pass a YAML "
                          "file") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}: fix the syntax") from exc
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise ConfigError(f"config file {path} holds a {type(d).__name__}, not a mapping of keys: write one key: "
                          "value per line")
    return d
