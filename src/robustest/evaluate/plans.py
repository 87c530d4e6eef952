"""The attack plans of :func:`robustest.evaluate.evaluate`: which attacks run, in order, with which settings, and
on which of the samples still robust.

* ``standard``: AutoAttack's standard version (Croce & Hein 2020): APGD-CE -> APGD-T (9 targets) -> FAB-T (9
  targets) -> Square (5000 queries).
* ``fast``: APGD-CE -> APGD-T (3 targets).
* ``rand``: AutoAttack's version for randomised models: APGD-CE and APGD-DLR, each with Expectation over
  Transformation over 20 forward and backward passes per step (success judged by the majority of repeated
  forwards, see :func:`robustest.evaluate.evaluate`).
* ``auto`` (the default): ``fast``, then a short Square run (1000 queries) on a seeded sample of at most 100 of the
  survivors (``square-probe``); only where the probe broke a sample do FAB-T and the full Square run on every
  survivor (``escalate``); samples whose input gradient is zero or not finite get a long Square run (10,000
  queries, ``bad-gradient``); survivors whose APGD-CE loss still rose in its last tenth of the steps get APGD-CE
  with 300 steps (``incomplete``, Pintor et al. 2022's incomplete optimisation). A randomised model gets
  ``rand``; a model without a gradient path only the long Square run.
* ``custom``: the attacks named.

``fast`` and ``custom`` (without a gradient-free attack) also get the Square probe as a check (:func:`probe_step`):
its breaks count, and a probe that breaks what the gradient attacks left robust raises ``gradient-free-breaks``.

A step's ``only`` says which survivors it attacks: ``all``, ``probe``, ``escalate`` (all, but only when a probe
broke some sample of the block), ``bad-gradient`` or ``incomplete``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from robustest.attacks import canonical_name
from robustest.attacks import get as get_attack
from robustest.core.errors import ConfigError

__all__ = ["AUTOATTACK_NAMES", "EVAL_VERSIONS", "PROBE_SIZE", "PlanStep", "ensemble_plan", "ensemble_steps",
           "probe_step", "skipped_attacks", "transfer_step"]

EVAL_VERSIONS = ("auto", "standard", "fast", "rand", "custom")
#: AutoAttack's names of the ensemble attacks -> robustest registry names
AUTOATTACK_NAMES = {"apgd-ce": "apgd", "apgd-dlr": "apgd_dlr", "apgd-t": "apgd_t", "fab": "fab", "fab-t": "fab_t",
                    "square": "square"}
#: the steps of the fixed versions that are no AutoAttack name -> registry name
_EXTRA_NAMES = {"square-probe": "square", "square-long": "square", "apgd-ce-long": "apgd"}
#: survivors a probe attacks per block at most
PROBE_SIZE = 100
#: forward and backward passes per step of the rand version's attacks (AutoAttack's)
EOT_ITER = 20
_APGD = {"steps": 100, "restarts": 1, "rho": 0.75}
_SQUARE = {"queries": 5000, "p_init": 0.8, "restarts": 1}
_STANDARD = (("apgd-ce", dict(_APGD), "all"), ("apgd-t", {**_APGD, "n_targets": 9}, "all"),
             ("fab-t", {"steps": 100, "restarts": 1, "n_targets": 9}, "all"), ("square", dict(_SQUARE), "all"))
_FAST = (("apgd-ce", dict(_APGD), "all"), ("apgd-t", {**_APGD, "n_targets": 3}, "all"))
_PROBE = ("square-probe", {**_SQUARE, "queries": 1000}, "probe")
_AUTO = ((_FAST[0][0], {**_FAST[0][1], "return_trace": True}, "all"), _FAST[1], _PROBE,
         ("fab-t", {"steps": 100, "restarts": 1, "n_targets": 9}, "escalate"),
         ("square", dict(_SQUARE), "escalate"),
         ("square-long", {**_SQUARE, "queries": 10000}, "bad-gradient"),
         ("apgd-ce-long", {**_APGD, "steps": 300}, "incomplete"))
_RAND = (("apgd-ce", {**_APGD, "eot_iter": EOT_ITER}, "all"), ("apgd-dlr", {**_APGD, "eot_iter": EOT_ITER}, "all"))
_GRADIENT_FREE = (("square-long", {**_SQUARE, "queries": 10000}, "all"),)
_TABLES = {"standard": _STANDARD, "fast": _FAST, "auto": _AUTO, "rand": _RAND}


@dataclass
class PlanStep:
    """One attack of a plan: ``name`` (display: AutoAttack's name or the registry name), ``attack`` (registry
    name), ``fn``, ``params``, ``only`` (which survivors) and ``gradient_free`` (Square: needs no gradient)."""

    name: str
    attack: str
    fn: Any
    params: dict[str, Any]
    only: str = "all"
    on_surrogate: bool = False

    @property
    def gradient_free(self) -> bool:
        """Square (queries only) and transfers from a surrogate use no gradient of the model."""
        return self.attack == "square" or self.on_surrogate

    @property
    def needs_gradient(self) -> bool:
        return not self.gradient_free

    def as_tuple(self) -> tuple[str, str, dict]:
        return self.name, self.attack, dict(self.params)


def ensemble_plan(version: str = "auto", norm: str = "linf", attacks: Any = None, *,
                  n_targets: int | None = None, num_classes: int | None = None) -> list[tuple[str, str, dict]]:
    """The attacks :func:`robustest.evaluate.evaluate` runs, in order, as ``(display name, registry name,
    parameters)`` (for ``auto``: on a model that is neither randomised nor without gradients; see the module
    docstring for the versions). ``custom``: ``attacks``, a list of names (AutoAttack's ``apgd-ce``, ``apgd-dlr``,
    ``apgd-t``, ``fab``, ``fab-t``, ``square`` or any :func:`robustest.attacks.names`) or ``(name, {param: value})``
    pairs. ``n_targets`` replaces the number of target classes of APGD-T and FAB-T; by default it is
    ``min(9, classes - 1)``. With fewer than 4 classes APGD-T is left out (its loss needs 4 logits), with fewer
    than 3 APGD-DLR. Attacks that can (APGD, FAB) stop working on a sample once it is broken
    (``stop_on_success``; AutoAttack runs every sample for all steps: the same samples are broken, at less cost).
    """
    return [s.as_tuple() for s in ensemble_steps(version, norm, attacks, n_targets=n_targets,
                                                 num_classes=num_classes)]


def _items(version: str, attacks: Any) -> list[tuple[str, dict, str, bool]]:
    """(name, params, only, given by the user) of a version's attacks."""
    if version not in EVAL_VERSIONS and version != "gradient-free":
        raise ConfigError(f"unknown version {version!r}: use one of {', '.join(EVAL_VERSIONS)}")
    if version != "custom" and attacks:
        raise ConfigError(f"attacks are chosen by version={version!r}; pass version='custom' to choose them")
    if version == "custom":
        if not attacks:
            raise ConfigError("version='custom' needs attacks: e.g. ['apgd-ce', 'square']")
        items = [a if isinstance(a, (tuple, list)) else (a, {}) for a in
                 ([attacks] if isinstance(attacks, str) else attacks)]
        for item in items:
            if len(item) != 2 or not isinstance(item[1], dict):
                raise ConfigError(f"an attack is a name or a (name, params) pair, got {item!r}")
        return [(str(n), dict(p), "all", True) for n, p in items]
    table = _GRADIENT_FREE if version == "gradient-free" else _TABLES[version]
    return [(n, dict(p), only, False) for n, p, only in table]


def _check_n_targets(n_targets: Any, num_classes: int | None) -> None:
    if n_targets is None:
        return
    if isinstance(n_targets, bool) or not isinstance(n_targets, int) or n_targets < 1:
        raise ConfigError(f"n_targets must be a positive integer, got {n_targets!r}")
    if num_classes is not None and n_targets > num_classes - 1:
        raise ConfigError(f"n_targets={n_targets} but the model has {num_classes} classes: use at most "
                          f"{num_classes - 1}")


def ensemble_steps(version: str = "auto", norm: str = "linf", attacks: Any = None, *, n_targets: int | None = None,
                   num_classes: int | None = None) -> list[PlanStep]:
    """The :class:`PlanStep` list of :func:`ensemble_plan` (also ``version="gradient-free"``: the long Square run
    alone, what a model without a gradient path gets)."""
    version = str(version).lower()
    items = _items(version, attacks)
    _check_n_targets(n_targets, num_classes)
    custom = version == "custom"
    plan: list[PlanStep] = []
    for raw, params, only, given in items:
        key = raw.lower().replace("_", "-")
        reg = AUTOATTACK_NAMES.get(key) or (_EXTRA_NAMES.get(key) if not given else None) or canonical_name(raw)
        display = key if key in AUTOATTACK_NAMES or (key in _EXTRA_NAMES and not given) else reg
        record = get_attack(reg)
        fn = record.fn
        sig = inspect.signature(fn).parameters
        bad = [p for p in params if p not in sig or p in ("model", "x", "y", "eps", "norm", "seed", "generator",
                                                            "batch_size", "target")]
        if bad:
            raise ConfigError(f"attack {display!r} does not take parameter(s) {', '.join(bad)}")
        if "stop_on_success" in sig:
            params.setdefault("stop_on_success", True)  # a broken sample needs no more steps
        if norm not in record.norms:
            what = "L-inf only" if record.norms == ("linf",) else "an L2 attack"
            raise ConfigError(f"attack {display!r} is {what}: use it with norm={record.norms[0]!r}")
        if "norm" in sig:
            params["norm"] = norm
        if num_classes is not None and num_classes < record.min_classes:
            if custom:
                raise ConfigError(f"{display} needs a model with at least {record.min_classes} classes, this one "
                                  f"has {num_classes}")
            continue  # a step the model cannot take (APGD-T on 3 classes) leaves the default plan
        if "n_targets" in sig:
            k = n_targets if n_targets is not None else params.get("n_targets", 9)
            if num_classes is not None:
                if n_targets is None and (not custom or "n_targets" not in params or not given):
                    k = min(k, num_classes - 1)  # the default (9) adapts to the model
                if k > num_classes - 1:
                    raise ConfigError(f"{display}: n_targets={k} but the model has {num_classes} classes: use at "
                                      f"most {num_classes - 1}")
            params["n_targets"] = k
        plan.append(PlanStep(display, reg, fn, params, only))
    names_seen = [p.name for p in plan]
    if len(set(names_seen)) != len(names_seen):
        dup = sorted({n for n in names_seen if names_seen.count(n) > 1})
        raise ConfigError(f"attack(s) {', '.join(dup)} listed twice: give each attack once")
    return plan


def skipped_attacks(version: str, plan: list[PlanStep], num_classes: int) -> dict[str, str]:
    """The attacks of a fixed version left out for the model (APGD-T with fewer than 4 classes, APGD-DLR with
    fewer than 3), each with the reason."""
    if version not in _TABLES:
        return {}
    have = {s.name for s in plan}
    need = {"apgd-t": 4, "apgd-dlr": 3}
    return {d: f"needs at least {need[d]} classes, the model has {num_classes}" for d, _, _ in _TABLES[version]
            if d not in have and d in need}


def transfer_step(norm: str) -> PlanStep:
    """The transfer attack from a surrogate model: APGD-CE (100 steps, every step run: a high-loss point of the
    surrogate transfers better than its first success), its points judged on the real model."""
    return PlanStep("transfer", "apgd", get_attack("apgd").fn, {**_APGD, "norm": norm, "stop_on_success": False},
                    "all", on_surrogate=True)


def probe_step(norm: str) -> PlanStep:
    """The Square probe (1000 queries on a seeded sample of at most :data:`PROBE_SIZE` survivors per block): the
    check every plan without a gradient-free attack gets, since a model can mask its gradients without zeroing
    them (a decoy backward pass); its breaks count, and raise ``gradient-free-breaks``."""
    name, params, only = _PROBE
    return PlanStep(name, "square", get_attack("square").fn, {**params, "norm": norm}, only)
