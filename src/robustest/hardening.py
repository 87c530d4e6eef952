"""Adversarial fine-tuning ("hardening"): train a model on adversarial examples generated against the model
as it learns, with five methods spanning the cost range, every one counting its compute.

=============  ===========================================================================================
``pgd-at``     Madry et al. (2018): k-step L-inf PGD with a uniform random start, step ``alpha``; the loss is
               ``mix * CE(x) + (1 - mix) * CE(x_adv)`` (``mix = 0``: pure adversarial training).
``trades``     Zhang et al. (2019): ``CE(f(x), y) + beta * KL(p(x) || p(x_adv))``, the inner maximisation of
               the KL by k sign-gradient steps from ``x + 0.001 * N(0, I)`` (their PGD-KL).
``fosc``       Dynamic adversarial training (Wang et al., ICML 2019): per sample, PGD stops once the first-order
               stationarity condition FOSC (= RobOT's FOL) falls to ``c_t`` or below; ``c_t`` falls linearly from
               ``fosc_c_max`` to 0 over the first ``fosc_warmup`` fraction of the epochs.
``fol-budget`` per sample, PGD stops as soon as its FOL falls to ``fol_threshold`` or below, or the sample is
               misclassified: easy samples cost one or two gradient evaluations, hard ones the full budget.
``fast-at``    Wong et al. (2020): one FGSM step of ``alpha = 1.25 eps`` from a uniform random start.
=============  ===========================================================================================

FOL / FOSC of a point x' of the L-inf ball around x (g = grad_x CE(f(x'), y), per sample):
``eps * ||g||_1 - <x' - x, g>``; it is 0 at a first-order stationary point of the inner maximisation.
``fosc`` and ``fol-budget`` run a batched PGD whose active set shrinks: at every gradient evaluation the samples
that meet their stopping rule keep their current point and leave the set, and the forward/backward passes of the
next step run on the remaining samples only (index selection, no per-sample Python loop). The check uses the
gradient the step needs anyway, so it costs nothing extra. ``fosc`` checks from the second evaluation on (the
first step is always taken, as in the reference code); ``fol-budget`` checks from the first (a sample already
misclassified at its random start costs one evaluation).

Mode choice (BatchNorm, dropout): adversarial examples are generated with the model in eval mode (running
statistics, no dropout, no update of BatchNorm statistics, gradients w.r.t. the input only), then the update step
runs in train mode, as common PyTorch adversarial-training code does (TRADES' reference code, Rice et al. 2020).
Per-sample stopping therefore does not depend on which other samples are still active.

Compute accounting: one *pass* is a forward plus a backward over one sample; a forward alone counts 1/3 of a pass
and a backward 2/3 (the usual estimate: a backward costs about twice a forward). Counts are kept separately as
sample-forwards and sample-backwards, for the attack (inner maximisation) and the update step, per epoch and in
total; ``passes = (forward + 2 * backward) / 3``. A PGD-AT epoch with k steps over N samples costs exactly
``N * (k + 1)`` passes (``N * (k + 2)`` with ``0 < mix < 1``, ``N`` with ``mix = 1``); TRADES ``N * (k + 2 + 1/3)``;
Fast-AT ``2 N``. Validation (``val=``) is reported apart and not counted as training compute.

Recipe (the settings that make adversarial training stable; docs/HARDEN.md has the sweeps behind the defaults):
``eps_warmup``: the radius grows linearly from 0 to ``eps`` over that fraction of the training steps (every batch
its own radius ``eps_t``; the step ``alpha`` scales with it; stepped per batch), as Gowal et al. (2018) and Wong et
al. (2020) do at MNIST's eps 0.3. ``schedule`` (None, "cosine", "step", "cyclic") with ``warmup_epochs`` and
``milestones``: the learning-rate schedule of :func:`robustest.recipes.make_schedule`, stepped per batch.
``optimizer`` "adam" or "sgd" (``momentum``, ``nesterov``), ``weight_decay``.

Robust early stopping (Rice et al. 2020): with ``val`` (held-out labelled data), every epoch ends with the clean
and PGD-``val_steps`` accuracy of the model on it; ``keep="best"`` ends with the weights of the epoch whose
validation PGD accuracy was highest (the latest of equal ones), ``keep="last"`` with the last epoch's.
Catastrophic-overfitting guard (``co_guard``, fast-at's default, needs ``val``): when an epoch's validation PGD
accuracy falls below half the best so far and at least 10 points under it (FGSM training has "collapsed": Wong
et al. 2020 report the same signature), training stops, the best epoch's weights are restored, and
``HardenResult.guard_epoch`` records the epoch that collapsed.

Randomness: epoch e draws its shuffling, random starts and dropout from seeds derived from ``(seed, e)``, so the
epoch number is the whole random state: a run resumed from the state written after epoch e (``state_dir``,
``resume=True``) gives the same final weights as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from robustest.attacks import _grad, _project, _random_start
from robustest.core.atomic import atomic_save
from robustest.core.batching import DataLike, as_tensors
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError, DataError, TrainingDiverged
from robustest.core.inputs import check_images, check_labels
from robustest.core.modelcall import eval_mode, forward, frozen_params
from robustest.core.progress import progress as progress_bar
from robustest.core.reading import load_plain
from robustest.core.seeding import make_generator, seed_everything
from robustest.core.validation import check_eps, check_float
from robustest.recipes import check_options, make_optimizer, make_schedule

__all__ = ["CO_MIN_DROP", "CO_RATIO", "KEEP", "METHODS", "RECIPE_DEFAULTS", "ComputeCount", "HardenResult",
           "check_trainable", "eps_schedule", "fosc_schedule", "harden", "harden_settings", "holdout_split"]

METHODS = ("pgd-at", "trades", "fosc", "fol-budget", "fast-at")
STATE_FORMAT = "robustest-harden-state"
STATE_VERSION = 2
STATE_FILE = "harden_state.pt"

#: Defaults of the method-specific parameters (None in :func:`harden` means "the method's default").
DEFAULTS: dict[str, Any] = {
    "steps": 10, "mix": 0.0, "beta": 6.0, "fosc_c_max": 0.5, "fosc_warmup": 0.8, "fol_threshold": 0.1,
    "stop_misclassified": True, "fol_min_steps": 2,
}
#: Recipe defaults of :func:`harden` (``robustest harden`` uses the same; docs/HARDEN.md gives the sweeps).
RECIPE_DEFAULTS: dict[str, Any] = {"optimizer": "adam", "lr": 1e-3, "schedule": None, "eps_warmup": 0.3}
KEEP = ("best", "last")
#: the catastrophic-overfitting rule: validation PGD accuracy below this fraction of the best so far ...
CO_RATIO = 0.5
#: ... and at least this far (absolute) below it
CO_MIN_DROP = 0.1
_OWNER = {"mix": ("pgd-at",), "beta": ("trades",), "fosc_c_max": ("fosc",), "fosc_warmup": ("fosc",),
          "fol_threshold": ("fol-budget",), "stop_misclassified": ("fol-budget",),
          "fol_min_steps": ("fol-budget",), "co_guard": ("fast-at",)}


# ------------------------------------------------------------------------------------------- compute counts
@dataclass
class ComputeCount:
    """Sample-forwards and sample-backwards of the attack and of the update step (see the module docstring)."""

    attack_forward: int = 0
    attack_backward: int = 0
    train_forward: int = 0
    train_backward: int = 0

    @property
    def forward(self) -> int:
        return self.attack_forward + self.train_forward

    @property
    def backward(self) -> int:
        return self.attack_backward + self.train_backward

    @property
    def passes(self) -> float:
        """Forward+backward passes over one sample: ``(forward + 2 * backward) / 3``."""
        return (self.forward + 2 * self.backward) / 3

    @property
    def attack_passes(self) -> float:
        return (self.attack_forward + 2 * self.attack_backward) / 3

    def add(self, other: ComputeCount) -> ComputeCount:
        return ComputeCount(self.attack_forward + other.attack_forward, self.attack_backward + other.attack_backward,
                            self.train_forward + other.train_forward, self.train_backward + other.train_backward)

    def to_dict(self) -> dict[str, Any]:
        return {"passes": self.passes, "attack_passes": self.attack_passes,
                "train_passes": (self.train_forward + 2 * self.train_backward) / 3,
                "forward": self.forward, "backward": self.backward,
                "attack_forward": self.attack_forward, "attack_backward": self.attack_backward,
                "train_forward": self.train_forward, "train_backward": self.train_backward}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ComputeCount:
        return cls(int(d["attack_forward"]), int(d["attack_backward"]), int(d["train_forward"]),
                   int(d["train_backward"]))


@dataclass
class HardenResult:
    """What :func:`harden` did.

    ``settings``: every parameter in effect (defaults resolved). ``epochs``: one dict per epoch with ``epoch``,
    ``loss``, ``adv_accuracy`` (train-mode accuracy on the training inputs of the loss' adversarial term),
    ``lr``, ``seconds``, ``compute`` (:meth:`ComputeCount.to_dict`), ``attack_evals_mean`` (gradient evaluations
    of the inner maximisation per sample), ``stopped_early`` (fraction of samples whose attack stopped before the
    budget), ``fosc_c`` (fosc: the epoch's c_t), ``eps`` (the radius of the epoch's last batch; below the target
    during the eps warm-up) and, with ``val``, ``val_clean_accuracy`` / ``val_pgd_accuracy``. ``compute``: the
    totals over all epochs. ``resumed_epochs``: epochs loaded from ``state_dir`` (0: fresh run). ``best_epoch``:
    the epoch of the highest validation PGD accuracy (None without ``val``); ``kept_epoch``: the epoch whose
    weights the model ends with; ``guard_epoch``: the epoch at which the catastrophic-overfitting guard stopped
    training (None: it did not); ``last_weights``: the last epoch's state_dict (on the CPU) when another epoch's
    weights were kept, else None.
    """

    method: str
    settings: dict[str, Any]
    epochs: list[dict[str, Any]] = field(default_factory=list)
    num_samples: int = 0
    resumed_epochs: int = 0
    best_epoch: int | None = None
    kept_epoch: int | None = None
    guard_epoch: int | None = None
    last_weights: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def compute(self) -> dict[str, Any]:
        total = ComputeCount()
        for e in self.epochs:
            total = total.add(ComputeCount.from_dict(e["compute"]))
        return total.to_dict()

    @property
    def seconds(self) -> float:
        return float(sum(e["seconds"] for e in self.epochs))

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "settings": dict(self.settings), "num_samples": self.num_samples,
                "epochs": [dict(e) for e in self.epochs], "compute": self.compute, "seconds": self.seconds,
                "resumed_epochs": self.resumed_epochs, "best_epoch": self.best_epoch, "kept_epoch": self.kept_epoch,
                "guard_epoch": self.guard_epoch}


# --------------------------------------------------------------------------------------------- validation
def _number(v: Any, name: str, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
            hint: str = "") -> float:
    if isinstance(v, bool):
        raise ConfigError(f"{name} must be a number, got {v!r}")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {v!r}") from None
    if not math.isfinite(f):
        raise ConfigError(f"{name} must be a finite number, got {v!r}{hint}")
    if lo is not None and (f < lo or (lo_open and f == lo)) or hi is not None and f > hi:
        left = "(" if lo_open else "["
        rng = f"{left}{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise ConfigError(f"{name} must lie in {rng}, got {v!r}{hint}")
    return f


def _integer(v: Any, name: str, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def harden_settings(method: str = "pgd-at", eps: float = 0.3, epochs: int = 5, *, batch_size: int = 128,
                    lr: float = RECIPE_DEFAULTS["lr"], optimizer: str = RECIPE_DEFAULTS["optimizer"],
                    weight_decay: float = 0.0, momentum: float | None = None, nesterov: bool | None = None,
                    schedule: str | None = RECIPE_DEFAULTS["schedule"], warmup_epochs: float = 0.0,
                    milestones: Sequence[float] | None = None, eps_warmup: float = RECIPE_DEFAULTS["eps_warmup"],
                    steps: int | None = None, alpha: float | None = None, mix: float | None = None,
                    beta: float | None = None, fosc_c_max: float | None = None, fosc_warmup: float | None = None,
                    fol_threshold: float | None = None, stop_misclassified: bool | None = None,
                    fol_min_steps: int | None = None, co_guard: bool | None = None, keep: str = "last",
                    seed: int = 0) -> dict[str, Any]:
    """The settings :func:`harden` would use for these arguments (defaults resolved), without doing any work.

    Raises :class:`ConfigError` with one line for an unknown method, eps outside (0, 1], a non-finite or
    out-of-range number, epochs < 1, or a method parameter given to another method.
    """
    given = {"mix": mix, "beta": beta, "fosc_c_max": fosc_c_max, "fosc_warmup": fosc_warmup,
             "fol_threshold": fol_threshold, "stop_misclassified": stop_misclassified, "fol_min_steps": fol_min_steps,
             "co_guard": co_guard}
    m = str(method).lower().replace("_", "-")
    if m not in METHODS:
        raise ConfigError(f"unknown harden method {method!r}: choose one of {', '.join(METHODS)}")
    eps_f = float(check_eps("eps", eps))  # the project's one radius check (same message in every verb)
    n_epochs = _integer(epochs, "epochs")
    s: dict[str, Any] = {"method": m, "eps": eps_f, "norm": "linf", "epochs": n_epochs,
                         "batch_size": _integer(batch_size, "batch_size")}
    opt_name = str(optimizer).lower()
    if opt_name == "sgd" and nesterov is None:
        nesterov = False  # harden's SGD: plain momentum unless asked (the adversarial-training papers' choice)
    opts = check_options(n_epochs, optimizer=opt_name, lr=lr, weight_decay=weight_decay, momentum=momentum,
                         nesterov=nesterov, schedule=schedule, warmup_epochs=warmup_epochs, milestones=milestones)
    s.update({"lr": opts.lr, "optimizer": opts.optimizer, "weight_decay": opts.weight_decay})
    if opts.optimizer == "sgd":
        s.update({"momentum": opts.momentum, "nesterov": opts.nesterov})
    s.update({"schedule": opts.schedule, "warmup_epochs": opts.warmup_epochs,
              "milestones": list(opts.milestones) if opts.milestones is not None else None})
    s["eps_warmup"] = check_float("eps_warmup", eps_warmup, 0.0, 1.0, hi_open=True)  # a fraction of the steps
    k = str(keep).lower()
    if k not in KEEP:
        raise ConfigError(f"keep must be 'best' (robust early stopping on the validation data) or 'last', got {keep!r}")
    s["keep"] = k
    for key, owners in _OWNER.items():
        if given.get(key) is not None and m not in owners:
            raise ConfigError(f"{key} applies to method {' / '.join(owners)} only, not {m!r}: leave it unset")
    if m == "fast-at":
        s["co_guard"] = True if co_guard is None else bool(co_guard)
        if steps is not None and steps != 1:
            raise ConfigError(f"fast-at takes exactly one step, got steps={steps!r}: use pgd-at for more")
        s["steps"] = 1
    else:
        s["steps"] = _integer(DEFAULTS["steps"] if steps is None else steps, "steps")
    default_alpha = 1.25 * eps_f if m == "fast-at" else 2.5 * eps_f / s["steps"]
    s["alpha"] = default_alpha if alpha is None else _number(alpha, "alpha", lo=0.0, hi=1.0, lo_open=True)
    if m == "pgd-at":
        s["mix"] = _number(DEFAULTS["mix"] if given.get("mix") is None else given["mix"], "mix", lo=0.0, hi=1.0)
    elif m == "trades":
        s["beta"] = _number(DEFAULTS["beta"] if given.get("beta") is None else given["beta"], "beta", lo=0.0)
    elif m == "fosc":
        s["fosc_c_max"] = _number(DEFAULTS["fosc_c_max"] if given.get("fosc_c_max") is None else given["fosc_c_max"],
                                  "fosc_c_max", lo=0.0)
        s["fosc_warmup"] = _number(DEFAULTS["fosc_warmup"] if given.get("fosc_warmup") is None
                                   else given["fosc_warmup"], "fosc_warmup", lo=0.0, hi=1.0, lo_open=True)
    elif m == "fol-budget":
        s["fol_threshold"] = _number(DEFAULTS["fol_threshold"] if given.get("fol_threshold") is None
                                     else given["fol_threshold"], "fol_threshold", lo=0.0)
        stop = given.get("stop_misclassified")
        s["stop_misclassified"] = DEFAULTS["stop_misclassified"] if stop is None else bool(stop)
        ms = given.get("fol_min_steps")
        s["fol_min_steps"] = _integer(DEFAULTS["fol_min_steps"] if ms is None else ms, "fol_min_steps", 0)
        if s["fol_min_steps"] >= s["steps"]:
            raise ConfigError(f"fol_min_steps ({s['fol_min_steps']}) must be below steps ({s['steps']}), or the "
                              "stopping rule never applies: use pgd-at")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    s["seed"] = int(seed)
    return s


def check_trainable(model: Any) -> None:
    """Raise :class:`ConfigError` unless ``model`` is an ``nn.Module`` with at least one trainable parameter."""
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if (getattr(model, "robustest_source", None) or {}).get("kind") == "export":
        raise ConfigError("a torch.export program (.pt2) is frozen for inference and cannot be trained: harden the "
                          "model it was exported from (--checkpoint model.pt or --model pkg.module:factory --weights)")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError("the model has no trainable parameters (a frozen TorchScript model, or requires_grad off "
                          "everywhere): harden needs weights it can train")


def fosc_schedule(epoch: int, epochs: int, c_max: float, warmup: float) -> float:
    """Dynamic AT's criterion for ``epoch`` (1-based) of ``epochs``: ``c_max * max(0, 1 - (epoch - 1) / T')`` with
    ``T' = warmup * epochs`` (the reference code: ``c_max - c_max * ep / dynamic_epoch``, ep 0-based)."""
    return float(c_max * max(0.0, 1.0 - (epoch - 1) / (warmup * epochs)))


def eps_schedule(step: int, total_steps: int, eps: float, warmup: float) -> float:
    """The radius of training step ``step`` (0-based) of ``total_steps``: ``eps * min(1, (step + 1) / W)`` with
    ``W = warmup * total_steps`` steps of linear warm-up (``warmup = 0``: ``eps`` from the first step)."""
    w = warmup * total_steps
    if w <= 1.0:
        return float(eps)
    return float(eps * min(1.0, (step + 1) / w))


def holdout_split(labels: torch.Tensor, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A class-stratified hold-out: (train positions, validation positions), int64 [N - k] and [k], both sorted.

    ``labels``: int64 [N]. Each class gets a share of the ``k`` validation samples proportional to its size
    (largest remainders, ties to the smaller class index), drawn uniformly within the class by a generator
    seeded from ``seed``; the same labels, k and seed give the same split.
    """
    labels = torch.as_tensor(labels).reshape(-1).long()
    n = int(labels.numel())
    k = _integer(k, "k", 0)
    if k > n:
        raise ConfigError(f"cannot hold out {k} of {n} samples")
    classes, counts = torch.unique(labels, return_counts=True)
    exact = counts.double() * k / max(n, 1)
    share = exact.floor().long()
    rest = k - int(share.sum())
    if rest > 0:
        order = torch.argsort(-(exact - share), stable=True)
        share[order[:rest]] += 1
    gen = make_generator(_derive_seed(seed, "holdout"))
    key = torch.rand(n, generator=gen)
    # within each class, the samples with the smallest keys are held out
    order = torch.argsort(labels.double() * 2 + key)  # class first, then the random key (key < 1 < 2)
    pos_in_class = torch.empty(n, dtype=torch.long)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n) - torch.repeat_interleave(starts, counts)
    pos_in_class[order] = rank
    cls_index = torch.searchsorted(classes, labels)
    held = pos_in_class < share[cls_index]
    idx = torch.arange(n)
    return idx[~held], idx[held]


def _derive_seed(*parts: Any) -> int:
    digest = hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


# ------------------------------------------------------------------------------------------- inner loops
def _fol(g: torch.Tensor, delta: torch.Tensor, eps: float) -> torch.Tensor:
    """FOL / FOSC for L-inf: ``eps * ||g||_1 - <delta, g>`` per sample (delta = x' - x)."""
    gf = g.flatten(1)
    return eps * gf.abs().sum(1) - (delta.flatten(1) * gf).sum(1)


def _pgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, *, eps: float, alpha: float,
         steps: int, threshold: float | None = None, first_check: int = 0, stop_misclassified: bool = False
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """L-inf PGD from a uniform random start; with a stopping rule, its samples stop individually.

    Without a rule (``threshold`` None and ``stop_misclassified`` False) every sample takes ``steps`` steps of
    ``alpha * sign(grad)``, projected into the ball and [0, 1]. With a rule, from gradient evaluation
    ``first_check`` on (0-based), a sample whose FOL is <= ``threshold`` (or, with ``stop_misclassified``, that
    is misclassified) keeps its current point and leaves the active set; only active samples go through the
    model. x: N x C x H x W, y: int64 [N]. Returns (x_adv N x C x H x W, evals: int64 [N] gradient evaluations
    spent on each sample).
    """
    lo, hi = (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)
    adv = _random_start(x, eps, "linf", gen)
    n = x.shape[0]
    if threshold is None and not stop_misclassified:
        for _ in range(steps):
            g, _ = _grad(model, adv, y)
            adv = adv.add_(g.sign_(), alpha=alpha).clamp_(lo, hi)
        return adv, torch.full((n,), steps, dtype=torch.long, device=x.device)
    evals = torch.zeros(n, dtype=torch.long, device=x.device)
    active = torch.arange(n, device=x.device)
    xa = adv
    for k in range(steps):
        ya = y.index_select(0, active)
        g, logits = _grad(model, xa, ya)
        evals.index_add_(0, active, torch.ones_like(active))
        if k >= first_check:
            stop = torch.zeros_like(ya, dtype=torch.bool)
            if threshold is not None:
                stop |= _fol(g, xa - x.index_select(0, active), eps) <= threshold
            if stop_misclassified:
                stop |= logits.argmax(1) != ya
            if bool(stop.any()):
                keep = ~stop
                active, xa, g = active[keep], xa[keep], g[keep]
                if active.numel() == 0:
                    break
        xa = xa.add_(g.sign_(), alpha=alpha)
        xa = torch.max(torch.min(xa, hi.index_select(0, active)), lo.index_select(0, active))
        adv.index_copy_(0, active, xa)
    return adv, evals


def _trades_adv(model: nn.Module, x: torch.Tensor, gen: torch.Generator, *, eps: float, alpha: float,
                steps: int) -> torch.Tensor:
    """TRADES' inner maximisation: sign-gradient ascent on KL(p(x) || p(x')) from x + 0.001 * N(0, I)."""
    with torch.no_grad():
        p_nat = F.softmax(forward(model, x), dim=1)
    lo, hi = (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)
    adv = (x + 0.001 * torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype)).clamp_(lo, hi)
    for _ in range(steps):
        adv = adv.detach().requires_grad_(True)
        with torch.enable_grad():
            kl = F.kl_div(F.log_softmax(forward(model, adv), dim=1), p_nat, reduction="sum")
            (g,) = torch.autograd.grad(kl, adv)
        adv = _project(adv.detach() + alpha * g.sign(), x, eps, "linf", lo, hi)
    return adv.detach()


# --------------------------------------------------------------------------------------------- one batch
def _batch(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor, gen: torch.Generator, s: dict[str, Any],
           eps: float, fosc_c: float | None, opt: torch.optim.Optimizer, count: ComputeCount
           ) -> tuple[float, int, torch.Tensor]:
    """One training step of method ``s["method"]`` on a batch at radius ``eps`` (the step ``alpha`` scaled by
    ``eps / s["eps"]``); returns (loss, correct on adv, attack evals [B])."""
    m, steps = s["method"], s["steps"]
    alpha = s["alpha"] * eps / s["eps"]
    b = xb.shape[0]
    evals = torch.zeros(b, dtype=torch.long, device=xb.device)
    adv = None
    with eval_mode(model), frozen_params(model):
        if m in ("pgd-at", "fast-at"):
            if m == "fast-at" or s["mix"] < 1.0:
                adv, evals = _pgd(model, xb, yb, gen, eps=eps, alpha=alpha, steps=steps)
                adv = adv.detach()
        elif m == "trades":
            adv = _trades_adv(model, xb, gen, eps=eps, alpha=alpha, steps=steps)
            count.attack_forward += b
            evals += steps
        else:
            fosc = m == "fosc"
            adv, evals = _pgd(
                model, xb, yb, gen, eps=eps, alpha=alpha, steps=steps,
                threshold=fosc_c if fosc else s["fol_threshold"], first_check=1 if fosc else s["fol_min_steps"],
                stop_misclassified=False if fosc else s["stop_misclassified"])
            adv = adv.detach()
    n_evals = int(evals.sum())
    count.attack_forward += n_evals
    count.attack_backward += n_evals
    model.train()
    if m == "trades":
        logits_nat = forward(model, xb)
        logits_adv = forward(model, adv)
        kl = F.kl_div(F.log_softmax(logits_adv, dim=1), F.softmax(logits_nat, dim=1), reduction="sum") / b
        loss = F.cross_entropy(logits_nat, yb) + s["beta"] * kl
        used = 2 * b
    elif m == "pgd-at" and s["mix"] > 0.0:
        if adv is None:  # mix = 1: clean training
            logits_adv = forward(model, xb)
            loss = F.cross_entropy(logits_adv, yb)
            used = b
        else:
            logits = forward(model, torch.cat([xb, adv]))
            logits_nat, logits_adv = logits[:b], logits[b:]
            loss = s["mix"] * F.cross_entropy(logits_nat, yb) + (1 - s["mix"]) * F.cross_entropy(logits_adv, yb)
            used = 2 * b
    else:
        logits_adv = forward(model, adv)
        loss = F.cross_entropy(logits_adv, yb)
        used = b
    if not bool(torch.isfinite(loss)):
        raise TrainingDiverged(f"harden diverged: the {m} loss is {float(loss.detach())}; lower the learning rate "
                               f"(lr={s['lr']:g})" + (" or beta" if m == "trades" else ""))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    count.train_forward += used
    count.train_backward += used
    correct = int((logits_adv.detach().argmax(1) == yb).sum())
    return float(loss.detach()) * b, correct, evals


# ---------------------------------------------------------------------------------------------- state
def _digest(x: torch.Tensor, y: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in (x, y):
        t = t.detach().cpu().contiguous()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def _fingerprint(settings: dict[str, Any], data_digest: str) -> str:
    return hashlib.sha256(json.dumps([settings, data_digest], sort_keys=True).encode()).hexdigest()


def _load_state(path: Path, fingerprint: str) -> dict[str, Any]:
    st = load_plain(path, fmt=STATE_FORMAT, what="harden state file",
                    fix="delete the state folder to start afresh")
    if int(st.get("version", 0)) > STATE_VERSION:
        raise DataError(f"{path} was written by a newer robustest: upgrade, or delete it to start afresh")
    if st.get("fingerprint") != fingerprint:
        raise ConfigError(f"{path} holds a run with other settings or data: resume with the same ones, or use "
                          "another state folder")
    return st


def _optimizer_and_schedule(model: nn.Module, s: dict[str, Any], steps_per_epoch: int
                            ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR | None]:
    """The optimiser and per-batch learning-rate schedule of settings ``s`` (robustest.recipes builds both)."""
    opts = check_options(s["epochs"], optimizer=s["optimizer"], lr=s["lr"], weight_decay=s["weight_decay"],
                         momentum=s.get("momentum"), nesterov=s.get("nesterov"), schedule=s["schedule"],
                         warmup_epochs=s["warmup_epochs"], milestones=s["milestones"])
    opt = make_optimizer(model, opts)
    return opt, make_schedule(opt, opts, s["epochs"], steps_per_epoch)


def _cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _check_data(data: DataLike, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = as_tensors(data)
    if y is None:
        raise DataError(f"harden needs labelled {what} data: pass (x, y) or a labelled Dataset")
    check_images(x, f"{what} images")
    y = check_labels(y, x.shape[0], name=f"{what} labels")
    if int(x.shape[0]) == 0:
        raise DataError(f"the {what} data is empty: check the split, the path and --limit")
    return x, y


def _collapsed(score: float, best: float) -> bool:
    """The catastrophic-overfitting rule: validation PGD accuracy under ``CO_RATIO`` of the best so far and at
    least ``CO_MIN_DROP`` below it."""
    return score < CO_RATIO * best and best - score >= CO_MIN_DROP


# ----------------------------------------------------------------------------------------------- harden
def harden(
    model: nn.Module,
    data: DataLike,
    method: str = "pgd-at",
    eps: float = 0.3,
    epochs: int = 5,
    *,
    batch_size: int = 128,
    lr: float = RECIPE_DEFAULTS["lr"],
    optimizer: str = RECIPE_DEFAULTS["optimizer"],
    weight_decay: float = 0.0,
    momentum: float | None = None,
    nesterov: bool | None = None,
    schedule: str | None = RECIPE_DEFAULTS["schedule"],
    warmup_epochs: float = 0.0,
    milestones: Sequence[float] | None = None,
    eps_warmup: float = RECIPE_DEFAULTS["eps_warmup"],
    steps: int | None = None,
    alpha: float | None = None,
    mix: float | None = None,
    beta: float | None = None,
    fosc_c_max: float | None = None,
    fosc_warmup: float | None = None,
    fol_threshold: float | None = None,
    stop_misclassified: bool | None = None,
    fol_min_steps: int | None = None,
    co_guard: bool | None = None,
    keep: str | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
    val: DataLike | None = None,
    val_steps: int = 10,
    on_epoch_end: Callable[[int, nn.Module, dict[str, Any]], Any] | None = None,
    state_dir: str | Path | None = None,
    resume: bool = False,
) -> HardenResult:
    """Adversarially train ``model`` in place on labelled ``data`` with ``method`` (see :data:`METHODS`): fine-tune a
    trained model, or train one from its random initialisation with the same call.

    ``data``: an (x, y) pair, a Dataset or a DataLoader (materialised): images N x C x H x W in [0, 1], int64
    labels [N]. ``eps``: L-inf radius in (0, 1], reached after ``eps_warmup`` (default 0.3) of the training steps.
    ``steps`` (default 10; fast-at: 1) gradient steps of ``alpha`` (default ``2.5 * eps / steps``; fast-at
    ``1.25 * eps``) for the inner maximisation. Method parameters (None: the default; setting one for another
    method is an error): ``mix`` (pgd-at, fraction of the loss on clean inputs, default 0), ``beta`` (trades,
    default 6), ``fosc_c_max`` / ``fosc_warmup`` (fosc, defaults 0.5 / 0.8: c_t reaches 0 after 80 % of the
    epochs), ``fol_threshold`` / ``stop_misclassified`` (fol-budget, defaults 0.1 / True), ``co_guard`` (fast-at,
    default True: the catastrophic-overfitting guard, active with ``val``). Training: ``optimizer`` "adam" (default)
    or "sgd" (``momentum`` 0.9, ``nesterov``), ``lr`` (default 1e-3), ``schedule`` (default None: constant;
    "cosine", "step", "cyclic"), ``warmup_epochs``, ``milestones``, ``weight_decay``, ``batch_size``, ``epochs``;
    randomness from ``seed`` only.

    ``val``: held-out labelled data measured after every epoch (clean accuracy and PGD-``val_steps`` accuracy,
    step eps/4, random start; not counted as training compute). ``keep``: "best" (the default with ``val``:
    robust early stopping, the model ends with the weights of the best validation PGD accuracy) or "last" (the
    default without). ``on_epoch_end(epoch, model, record)`` is called after every epoch, after the epoch's
    state was written. ``state_dir``: write the state after every epoch (model, optimizer, schedule, best epoch,
    history) atomically to ``state_dir/harden_state.pt``; ``resume=True`` continues from it (same settings and
    data required) and gives the same final weights as an uninterrupted run.

    Every argument is checked before any work (ConfigError / DataError with one line). The model ends in eval
    mode. Returns a :class:`HardenResult` with per-epoch figures and compute.
    """
    if keep is None:
        keep = "best" if val is not None else "last"
    s = harden_settings(method, eps, epochs, batch_size=batch_size, lr=lr, optimizer=optimizer,
                        weight_decay=weight_decay, momentum=momentum, nesterov=nesterov, schedule=schedule,
                        warmup_epochs=warmup_epochs, milestones=milestones, eps_warmup=eps_warmup, steps=steps,
                        alpha=alpha, mix=mix, beta=beta, fosc_c_max=fosc_c_max, fosc_warmup=fosc_warmup,
                        fol_threshold=fol_threshold, stop_misclassified=stop_misclassified,
                        fol_min_steps=fol_min_steps, co_guard=co_guard, keep=keep, seed=seed)
    check_trainable(model)
    val_steps = _integer(val_steps, "val_steps")
    if on_epoch_end is not None and not callable(on_epoch_end):
        raise ConfigError("on_epoch_end must be callable (epoch, model, record) or None")
    if resume and state_dir is None:
        raise ConfigError("resume=True needs the state_dir of the interrupted run")
    if s["keep"] == "best" and val is None:
        raise ConfigError("keep='best' picks the epoch by validation PGD accuracy: pass val= (held-out labelled "
                          "data) or keep='last'")
    x, y = _check_data(data, "training")
    xv, yv = _check_data(val, "validation") if val is not None else (None, None)
    n = int(x.shape[0])
    dev = resolve_device(model, device)
    model.to(dev)
    with torch.no_grad(), eval_mode(model):  # labels must index the model's outputs
        num_classes = forward(model, x[:1].to(dev)).shape[-1]
    check_labels(y, n, num_classes, name="training labels")
    if yv is not None:
        check_labels(yv, yv.shape[0], num_classes, name="validation labels")

    state_path = Path(state_dir) / STATE_FILE if state_dir is not None else None
    if state_path is not None and state_path.parent.exists() and not state_path.parent.is_dir():
        raise ConfigError(f"state_dir {str(state_path.parent)!r} exists and is not a folder")
    fp = ""
    if state_path is not None:
        fp = _fingerprint(s, _digest(x, y) + (_digest(xv, yv) if xv is not None else ""))
    bs = s["batch_size"]
    steps_per_epoch = -(-n // bs)
    opt, sched = _optimizer_and_schedule(model, s, steps_per_epoch)
    result = HardenResult(method=s["method"], settings=dict(s), num_samples=n)
    best: dict[str, Any] = {"epoch": None, "score": -1.0, "model": None}
    start = 0
    if state_path is not None and state_path.is_file():
        if not resume:
            raise ConfigError(f"{state_path.parent} already holds a harden run: resume it (--resume) or choose "
                              "another output folder")
        st = _load_state(state_path, fp)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        if sched is not None:
            sched.load_state_dict(st["schedule"])
        result.epochs = [dict(e) for e in st["history"]]
        best = dict(st["best"])
        result.guard_epoch = st.get("guard_epoch")
        start = result.resumed_epochs = int(st["epoch"])
    if state_path is not None:  # under torchrun every rank has read the state before rank 0 writes the next
        from robustest.core import distributed

        distributed.barrier()

    for epoch in range(start + 1, s["epochs"] + 1):
        if result.guard_epoch is not None:
            break
        t0 = time.perf_counter()
        record = _epoch(model, x, y, s, epoch, opt, sched, dev, progress, steps_per_epoch)
        if xv is not None:
            record.update(_validate(model, xv, yv, s["eps"], val_steps, _derive_seed(s["seed"], "val")))
            score = record["val_pgd_accuracy"]
            if s.get("co_guard") and best["epoch"] is not None and _collapsed(score, best["score"]):
                result.guard_epoch = epoch
                record["guard"] = "collapsed"
            elif score >= best["score"]:
                best = {"epoch": epoch, "score": score, "model": _cpu_state(model)}
        record["seconds"] = time.perf_counter() - t0
        result.epochs.append(record)
        if state_path is not None:
            atomic_save({"format": STATE_FORMAT, "version": STATE_VERSION, "fingerprint": fp, "epoch": epoch,
                         "settings": dict(s), "model": _cpu_state(model), "optimizer": opt.state_dict(),
                         "schedule": sched.state_dict() if sched is not None else None, "best": best,
                         "guard_epoch": result.guard_epoch, "history": result.epochs}, state_path)
        if on_epoch_end is not None:
            on_epoch_end(epoch, model, record)
    result.best_epoch = best["epoch"]
    result.kept_epoch = len(result.epochs) if result.epochs else None
    if (s["keep"] == "best" or result.guard_epoch is not None) and best["model"] is not None \
            and best["epoch"] != result.kept_epoch:
        result.last_weights = _cpu_state(model)
        model.load_state_dict(best["model"])
        result.kept_epoch = best["epoch"]
    model.eval()
    return result


def _epoch(model: nn.Module, x: torch.Tensor, y: torch.Tensor, s: dict[str, Any], epoch: int,
           opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LambdaLR | None, dev: torch.device,
           progress: bool, steps_per_epoch: int) -> dict[str, Any]:
    """One training epoch over (x, y) in the epoch's seeded order; returns its record (without validation)."""
    n, bs = int(x.shape[0]), s["batch_size"]
    total_steps = s["epochs"] * steps_per_epoch
    seed_everything(_derive_seed(s["seed"], epoch, "global"))  # dropout and any other global draws
    perm = torch.randperm(n, generator=make_generator(_derive_seed(s["seed"], epoch, "shuffle")))
    gen = make_generator(_derive_seed(s["seed"], epoch, "attack"), dev)
    fosc_c = fosc_schedule(epoch, s["epochs"], s["fosc_c_max"], s["fosc_warmup"]) if s["method"] == "fosc" \
        else None
    count = ComputeCount()
    total_loss, correct, evals_sum, early = 0.0, 0, 0, 0
    eps_t = s["eps"]
    starts = range(0, n, bs)
    for i, b0 in enumerate(progress_bar(starts, enabled=progress, desc=f"{s['method']} {epoch}/{s['epochs']}",
                                        total=len(starts), unit="batch")):
        idx = perm[b0:b0 + bs]
        xb = x[idx].to(dev, torch.float32, non_blocking=True)
        yb = y[idx].to(dev, torch.long, non_blocking=True)
        eps_t = eps_schedule((epoch - 1) * steps_per_epoch + i, total_steps, s["eps"], s["eps_warmup"])
        loss_sum, ok, evals = _batch(model, xb, yb, gen, s, eps_t, fosc_c, opt, count)
        if sched is not None:
            sched.step()
        total_loss += loss_sum
        correct += ok
        evals_sum += int(evals.sum())
        if s["method"] in ("fosc", "fol-budget"):
            early += int((evals < s["steps"]).sum())
    model.eval()
    record: dict[str, Any] = {
        "epoch": epoch, "loss": total_loss / n, "adv_accuracy": correct / n, "lr": opt.param_groups[0]["lr"],
        "eps": eps_t, "attack_evals_mean": evals_sum / n, "stopped_early": early / n, "compute": count.to_dict(),
    }
    if fosc_c is not None:
        record["fosc_c"] = fosc_c
    return record


def _validate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int, seed: int
              ) -> dict[str, float]:
    """Clean and PGD (``steps`` steps of eps/4, random start) accuracy on validation data, in eval mode."""
    from robustest.attacks import attack

    res = attack("pgd", model, (x, y), eps=eps, alpha=eps / 4, steps=steps, random_start=True, seed=seed)
    return {"val_clean_accuracy": res.clean_accuracy, "val_pgd_accuracy": res.robust_accuracy}
