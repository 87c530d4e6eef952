"""``evaluate``: a robustness evaluation that checks itself: the attack ensemble run per sample on the points
still robust, with clean, per-attack and worst-case robust accuracy, flags for every way the model may have fooled
the attacks and, optionally, accuracy under common corruptions.

Follows Croce & Hein (2020, "Reliable evaluation of adversarial robustness with an ensemble of diverse
parameter-free attacks"): the attacks run in order (standard: APGD-CE -> APGD-T -> FAB-T -> Square), each only on
the samples that every earlier attack left correctly classified, so the robust accuracy is the per-sample worst
case and the accuracy after each attack is cumulative. Before the attacks, :func:`robustest.evaluate.checks.
probe_model` probes the model (randomness, probability outputs, dynamic defences, a gradient path) and every
sample's input gradient is checked; the ``auto`` version acts on what they find (:mod:`robustest.evaluate.plans`),
and :mod:`robustest.evaluate.findings` turns it into flags.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from robustest import corruptions as _corr
from robustest.attacks import check_norm, with_bpda
from robustest.core.amp import AMP_MODES, check_amp
from robustest.core.batching import DataLike, as_tensors, iter_batches
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError, DataError
from robustest.core.inputs import check_images, check_labels, check_logits
from robustest.core.modelcall import eval_mode, forward, frozen_params
from robustest.core.options import spec
from robustest.core.stats import describe
from robustest.core.validation import check_eps
from robustest.evaluate.checks import (
    GRAD_NONFINITE,
    GRAD_OK,
    GRAD_ZERO,
    LogProbabilities,
    ModelProbe,
    gradient_path,
    probe_model,
    state_fingerprint,
)
from robustest.evaluate.clean import accuracy
from robustest.evaluate.corruption import (
    CorruptionResult,
    corruption_accuracy,
    corruption_summary,
    published_corruptions,
)
from robustest.evaluate.findings import collect_flags
from robustest.evaluate.flags import Flag, blocking, check_accepted
from robustest.evaluate.plans import (
    AUTOATTACK_NAMES,
    EVAL_VERSIONS,
    PlanStep,
    ensemble_plan,
    ensemble_steps,
    probe_step,
    skipped_attacks,
    transfer_step,
)
from robustest.evaluate.runner import GRAD_NO_PATH, RunSetup, Tally, attack_blocks

__all__ = ["AUTOATTACK_NAMES", "EVALUATE_OPTIONS", "EVAL_FORMAT", "EVAL_VERSIONS", "EvalResult", "ensemble_plan",
           "evaluate"]

EVAL_FORMAT = "robustest-eval-results"
#: images the model probe runs on
PROBE_IMAGES = 32
#: forward passes judging each point of a randomised model (the majority decides)
RANDOM_FORWARDS = 11
_GRAD_NAMES = {GRAD_OK: "ok", GRAD_ZERO: "zero", GRAD_NONFINITE: "non-finite", GRAD_NO_PATH: "no-path"}


@dataclass
class EvalResult:
    """Outcome of :func:`evaluate` on N samples. Accuracies are fractions in [0, 1].

    * ``clean_accuracy``; ``robust_accuracy``: the worst case over the ensemble (a sample counts when it is
      classified correctly clean and under every attack).
    * ``attacks``: cumulative robust accuracy after each attack, in order (AutoAttack's convention: the last
      entry equals ``robust_accuracy``); ``breaks``: samples each attack broke first; ``attacked``: samples it
      ran on (those still robust).
    * per sample (1-D, length N, CPU, in data order): ``index``, ``y``, ``clean_pred``, ``adv_pred`` (prediction on
      the worst case found: the adversarial point where a sample was broken, else the clean input),
      ``clean_correct``, ``robust``, ``broken_by`` (list of str: ``"misclassified"`` for a clean error, the
      name of the attack that broke the sample, ``""`` if robust), ``linf`` / ``l2`` (norms of the adversarial
      perturbation; 0 where none); ``adv`` (N x C x H x W, only with ``keep_adv``).
    * ``gradient`` (list of str per sample: ``ok``, ``zero``, ``non-finite``, ``no-path`` or ``""`` for a clean
      error), the input-gradient check of each sample;
    * ``flags``: what the checks found (:class:`robustest.evaluate.flags.Flag`), ``probe``: the model probe's
      measurements, ``forwards``: forward passes judging each point (1, or the majority of more for a randomised
      model); ``plan``: what ran (``auto`` may choose ``rand`` or ``gradient-free``).
    * with several radii (``evaluate(eps=[...])``): ``eps`` is the largest, the per-sample fields are those at
      the largest radius, ``curve`` one dict per radius (``eps``, ``robust_accuracy``, ``attacked``, ``broke``,
      ``plan``, ``reliable``, ``flags``, ``seconds``) and ``broken_at`` (float [N]) the smallest radius that broke
      each sample (0 for a clean error, NaN where robust at every radius).
    * ``corruption``: corruption accuracy summary (:func:`evaluate` with ``corruptions``), else None.
    * ``settings`` (what was run), ``timings`` (seconds).

    :meth:`blocking` gives the ``unreliable`` flags a gate fails on; :attr:`reliable` is True when there is none.
    """

    eps: float
    norm: str
    version: str
    clean_accuracy: float
    robust_accuracy: float
    attacks: dict[str, float]
    breaks: dict[str, int]
    attacked: dict[str, int]
    index: torch.Tensor
    y: torch.Tensor
    clean_pred: torch.Tensor
    adv_pred: torch.Tensor
    clean_correct: torch.Tensor
    robust: torch.Tensor
    broken_by: list[str]
    linf: torch.Tensor
    l2: torch.Tensor
    adv: torch.Tensor | None = None
    gradient: list[str] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    probe: dict[str, Any] = field(default_factory=dict)
    forwards: int = 1
    plan: str = ""
    curve: list[dict[str, Any]] | None = None
    broken_at: torch.Tensor | None = None
    corruption: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])

    @property
    def reliable(self) -> bool:
        """No flag of severity ``unreliable`` was raised."""
        return not blocking(self.flags)

    def blocking(self, accepted: Any = ()) -> list[Flag]:
        """The ``unreliable`` flags not in ``accepted`` (flag names): a gate fails while any is left."""
        return blocking(self.flags, check_accepted(accepted))

    def __repr__(self) -> str:
        per = ", ".join(f"{k} {100 * v:.2f}%" for k, v in self.attacks.items())
        corr = ""
        if self.corruption:
            corr = f"; corruptions {100 * self.corruption['mean_corruption_accuracy']:.2f}%"
        flags = ""
        if self.flags:
            flags = "; flags " + ", ".join(f"{f.name} ({f.severity})" for f in self.flags)
        return (f"EvalResult({self.norm} eps={self.eps:g}, {self.version}, n={self.num_samples}: clean "
                f"{100 * self.clean_accuracy:.2f}%, robust {100 * self.robust_accuracy:.2f}% [{per}]{corr}{flags})")

    def rows(self) -> list[dict[str, Any]]:
        """One dict per sample (index, label, clean_pred, clean_correct, adv_pred, robust, broken_by, linf, l2,
        gradient, flags: the names of the flags that name the sample, joined by "+")."""
        named: dict[int, list[str]] = {}
        for f in self.flags:
            for i in f.samples:
                named.setdefault(i, []).append(f.name)
        grads = self.gradient or [""] * self.num_samples
        cols = zip(self.index.tolist(), self.y.tolist(), self.clean_pred.tolist(), self.clean_correct.tolist(),
                   self.adv_pred.tolist(), self.robust.tolist(), self.broken_by, self.linf.tolist(), self.l2.tolist(),
                   grads)
        rows = [{"index": i, "label": y, "clean_pred": cp, "clean_correct": int(cc), "adv_pred": ap,
                 "robust": int(r), "broken_by": b, "linf": li, "l2": l2, "gradient": g,
                 "flags": "+".join(named.get(i, []))} for i, y, cp, cc, ap, r, b, li, l2, g in cols]
        if self.broken_at is not None:
            for row, e in zip(rows, self.broken_at.tolist()):
                row["broken_at_eps"] = None if math.isnan(e) else e
        return rows

    def to_dict(self) -> dict[str, Any]:
        """The results contract of ``robustest eval`` (docs/RESULTS_SCHEMA.md), without the model and data
        description the CLI adds; JSON-ready (NaN becomes null when written with atomic.atomic_write_json)."""
        n = self.num_samples
        total_breaks = sum(self.breaks.values())
        out: dict[str, Any] = {
            "format": EVAL_FORMAT, "version": 1, "world_size": 1,
            "threat_model": "Linf" if self.norm == "linf" else "L2", "norm": self.norm, "eps": self.eps,
            "ensemble": self.version, "num_samples": n,
            "clean_accuracy": self.clean_accuracy, "robust_accuracy": self.robust_accuracy,
            "attacks": dict(self.attacks), "breaks": dict(self.breaks), "attacked": dict(self.attacked),
            "share_of_breaks": {k: (v / total_breaks if total_breaks else 0.0) for k, v in self.breaks.items()},
            "misclassified_clean": int((~self.clean_correct).sum()),
            "perturbation": _quantiles(self.linf if self.norm == "linf" else self.l2,
                                       ~self.robust & self.clean_correct),
            "plan": self.plan or self.version, "forwards": self.forwards, "reliable": self.reliable,
            "flags": [f.to_dict() for f in self.flags], "probe": dict(self.probe),
        }
        if self.curve is not None:
            out["curve"] = [dict(c) for c in self.curve]
        if self.corruption is not None:
            out["corruptions"] = {k: v for k, v in self.corruption.items() if k not in ("result", "baseline_result")}
        out["settings"] = dict(self.settings)
        out["timings"] = dict(self.timings)
        out["robustbench"] = self.robustbench()
        return out

    def robustbench(self, **info: Any) -> dict[str, Any]:
        """The fields of a RobustBench ``model_info`` entry this evaluation fills (accuracies as percent strings
        with two decimals, as RobustBench writes them); ``info`` fills the descriptive ones (name, dataset, ...).
        ``autoattack_acc`` is set only for ``version="standard"`` and ``"rand"`` (the other versions are not
        AutoAttack's) and only when no flag says the figure is unreliable."""
        aa = (f"{100 * self.robust_accuracy:.2f}" if self.version in ("standard", "rand") and self.reliable
              else None)
        entry: dict[str, Any] = {"link": None, "name": None, "authors": None, "additional_data": None,
                                 "number_forward_passes": self.forwards, "dataset": None, "venue": None,
                                 "architecture": None,
                                 "eps": f"{self.eps:g}", "clean_acc": f"{100 * self.clean_accuracy:.2f}",
                                 "reported": None, "autoattack_acc": aa}
        if self.corruption is not None:
            entry["corruptions_acc"] = f"{100 * self.corruption['mean_corruption_accuracy']:.2f}"
            mce = self.corruption.get("mce")
            entry["corruptions_mce"] = None if mce is None else f"{100 * mce:.2f}"
        entry.update(info)
        return entry

def _quantiles(t: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    v = t[mask]
    return describe(v, ("mean", "median", "max")) if v.numel() else {}


# ------------------------------------------------------------------------------------------------ evaluate
def evaluate(model: nn.Module, data: DataLike, eps: float | list[float], norm: str = "linf", version: str = "auto",
             attacks: Any = None, *, n_targets: int | None = None, seed: int = 0, batch_size: int = 256,
             block_size: int = 4096, corruptions: Any = None, severities: Any = (1, 2, 3, 4, 5),
             baseline: Any = None, keep_adv: bool = False, progress: bool = False,
             amp: str | None = None, bpda: Any = None, surrogate: nn.Module | None = None,
             forwards: int | None = None) -> EvalResult:
    """Evaluate the robustness of ``model`` on labelled ``data`` at radius ``eps`` (L-inf or L2, pixel scale), and
    check the evaluation itself.

    ``version``: "auto" (the default: "fast", then a Square probe on a sample of the survivors, escalating to FAB-T
    and the full Square run where the probe breaks a sample; a long Square run on samples without a usable input
    gradient; "rand" for a randomised model; only gradient-free attacks for a model without a gradient path),
    "standard" (APGD-CE -> APGD-T -> FAB-T -> Square, AutoAttack's standard version), "fast" (APGD-CE -> APGD-T on
    3 target classes), "rand" (APGD-CE and APGD-DLR with EOT over 20 draws, AutoAttack's rand version) or "custom"
    (``attacks``); see :mod:`robustest.evaluate.plans`. Each attack runs only on the samples still classified
    correctly (clean misclassifications are never attacked), and a sample counts as broken only when the attack's
    point is misclassified (by the majority of ``forwards`` forward passes) and inside the eps-ball.

    Checks (every version): the model probe (:func:`robustest.evaluate.checks.probe_model`) and each sample's
    input gradient; their findings are :attr:`EvalResult.flags` (docs/EVAL.md lists them). A model returning
    probabilities is attacked through their logarithm. ``bpda``: submodule names (a comma-separated string, a list,
    or a mapping name -> approximation, see :func:`robustest.attacks.with_bpda`) whose backward pass the attacks
    replace by a differentiable approximation (straight-through identity by default); points are still judged on
    ``model``. ``surrogate``: a model whose APGD-CE points are transferred (judged on ``model``), after the gradient
    attacks. ``forwards``: passes judging each point (default 1, or 11 for a model the probe finds randomised).

    ``data``: anything :func:`robustest.core.batching.iter_batches` takes, with labels (images N x C x H x W in [0, 1],
    int64 labels [N]); it is processed in blocks of ``block_size`` images (memory stays bounded), the attacks in
    batches of ``batch_size``. Attack k on block b draws its randomness from a ``torch.Generator`` on the
    model's device seeded ``seed + k + b * BATCH_SEED_STRIDE`` (the first block: ``seed + k``), so the same
    seed, data and sizes give the same result for a deterministic model, and under torchrun (each rank evaluates
    whole blocks of its share; per-sample results are gathered on every rank, counts summed, timings summed over
    the ranks) the same result as one process. A randomised model's own randomness is never reseeded.

    ``corruptions``: None; ``"all"``, a group or a list of names (the 19 common corruptions of
    :mod:`robustest.corruptions` at ``severities``, via :func:`robustest.evaluate.corruption_accuracy`); or
    published -C data as ``{corruption: {severity: labelled data}}``. ``baseline``: a model (or a
    :class:`robustest.evaluate.CorruptionResult`) whose corruption errors normalise the mCE. ``keep_adv`` keeps
    the worst-case images (N x C x H x W) in the result.

    ``amp``: "bf16" (CPU or CUDA) or "fp16" (CUDA) runs the clean pass under ``torch.autocast``; the attacks and
    their predictions stay in float32.

    ``eps`` may be a list of radii: a robustness curve in one run (:attr:`EvalResult.curve`). The radii are
    attacked in increasing order, each only on the samples that survived the smaller one (a sample broken inside
    a ball is broken inside every larger ball); corruptions are measured once. The data are materialised as
    tensors for this.

    Bad input (raised before any attack runs, as one-line ConfigError/DataError): eps <= 0 (or > 1 for L-inf),
    an unknown norm or version, a model with fewer than 2 outputs, more target classes than classes - 1, an
    unknown BPDA submodule.
    """
    t_start = time.perf_counter()
    if isinstance(eps, (list, tuple)):
        return _evaluate_curve(model, data, list(eps), dict(
            norm=norm, version=version, attacks=attacks, n_targets=n_targets, seed=seed, batch_size=batch_size,
            block_size=block_size, keep_adv=keep_adv, progress=progress, amp=amp, bpda=bpda, surrogate=surrogate,
            forwards=forwards), dict(corruptions=corruptions, severities=severities, baseline=baseline))
    norm, eps, version = _check_arguments(model, eps, norm, version, batch_size, block_size)
    forwards = _check_forwards(forwards)
    corr_names, sets, severities = _check_corruptions(corruptions, severities, baseline)
    if surrogate is not None and not isinstance(surrogate, nn.Module):
        raise ConfigError(f"surrogate must be a torch.nn.Module, got {type(surrogate).__name__}")
    device = resolve_device(model)
    amp = check_amp(amp, device)
    num_classes, first = _count_classes(model, data, device)
    ensemble_steps(version, norm, attacks, n_targets=n_targets, num_classes=num_classes)  # checked before the probe
    t0 = time.perf_counter()
    attack_model, probe = _probed(model, first, bpda)
    probe_s = time.perf_counter() - t0
    plan_name, steps = _choose_plan(version, probe, norm, attacks, n_targets, num_classes, surrogate)
    judged = forwards if forwards is not None else (RANDOM_FORWARDS if probe.randomised else 1)
    setup = RunSetup(model=model, attack_model=attack_model, steps=steps, num_classes=num_classes, eps=eps,
                     norm=norm, seed=seed, batch_size=batch_size, block_size=block_size, device=device, amp=amp,
                     keep_adv=keep_adv, progress=progress, forwards=judged, gradient_path=probe.gradient_path,
                     surrogate=surrogate)
    before = state_fingerprint(model)
    tally = attack_blocks(data, setup)
    after = state_fingerprint(model)
    probe.changed_state += [f"{k} (while attacked)" for k in after if after[k] != before.get(k)
                            and k not in probe.changed_state]
    parts = tally.gather()
    tally.checks_s += probe_s
    flags = collect_flags(probe, parts, tally, steps, randomised_acted=plan_name == "rand", forwards=judged)
    settings = _settings(steps, tally, version=version, plan=plan_name, norm=norm, eps=eps, num_classes=num_classes,
                         seed=seed, batch_size=batch_size, block_size=block_size, device=device, amp=amp,
                         forwards=judged, bpda=bpda, surrogate=surrogate is not None)
    result = _result(parts, tally, settings, eps=eps, norm=norm, version=version, keep_adv=keep_adv)
    result.flags, result.probe, result.forwards, result.plan = flags, probe.to_dict(), judged, plan_name
    if corr_names is not None or sets is not None:
        _add_corruptions(result, model, data, corr_names=corr_names, sets=sets, severities=severities,
                         baseline=baseline, seed=seed, batch_size=batch_size)
    result.timings["total_s"] = time.perf_counter() - t_start
    return result


def _probed(model: nn.Module, first: tuple[torch.Tensor, torch.Tensor], bpda: Any) -> tuple[nn.Module, ModelProbe]:
    """The model the attacks differentiate (with ``bpda``'s approximations, through the logarithm of a model that
    returns probabilities) and the probe of ``model`` on the ``first`` batch (images, labels); with BPDA, the probe's
    gradient path is the approximated model's when the model itself has none."""
    attack_model, bpda_path = model, None
    if bpda:  # one gradient forward also checks the approximations' shapes, before any attack
        attack_model = with_bpda(model, bpda)
        with eval_mode(attack_model), frozen_params(attack_model):
            bpda_path = gradient_path(attack_model, first[0][:2])
    probe = probe_model(model, *first)
    if probe.probability_output:
        attack_model = LogProbabilities(attack_model)
    if bpda_path is not None and not probe.gradient_path:  # BPDA may give the path back
        probe.gradient_path, probe.gradient_error = bpda_path
    return attack_model, probe


def _choose_plan(version: str, probe: ModelProbe, norm: str, attacks: Any, n_targets: int | None,
                 num_classes: int, surrogate: nn.Module | None) -> tuple[str, list[PlanStep]]:
    """(the plan's name, its steps): ``auto`` acts on the probe (a randomised model gets ``rand``, one without a
    gradient path ``gradient-free``); every version without a gradient path runs the gradient-free plan; a
    surrogate adds the transfer step after the gradient attacks."""
    plan_name = version
    if version == "auto" and probe.randomised:
        plan_name = "rand"
    if not probe.gradient_path and version != "custom":
        plan_name = "gradient-free"
    steps = ensemble_steps(plan_name, norm, attacks if plan_name == "custom" else None, n_targets=n_targets,
                           num_classes=num_classes)
    if plan_name in ("fast", "custom") and not any(s.gradient_free for s in steps):
        steps.append(probe_step(norm))  # the check for gradients masked without being zero
    if surrogate is not None:
        free = [k for k, s in enumerate(steps) if s.gradient_free]
        steps.insert(free[0] if free else len(steps), transfer_step(norm))
    return plan_name, steps


def _check_forwards(forwards: Any) -> int | None:
    if forwards is None:
        return None
    if isinstance(forwards, bool) or not isinstance(forwards, int) or forwards < 1:
        raise ConfigError(f"forwards must be a positive integer, got {forwards!r}")
    return forwards


def _check_arguments(model: nn.Module, eps: Any, norm: str, version: str, batch_size: Any, block_size: Any
                     ) -> tuple[str, float, str]:
    """The checked ``(norm, eps, version)`` of :func:`evaluate`; a one-line ConfigError for bad ones."""
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(eps, torch.Tensor) and eps.dim() > 0:  # evaluate(model, x, y, eps): labels where eps goes
        raise ConfigError("evaluate(model, data, eps, ...) takes images and labels as ONE argument: call "
                          "evaluate(model, (x, y), eps)")
    norm = check_norm(norm)
    eps = check_eps("eps", eps, norm)
    version = str(version).lower()
    if version not in EVAL_VERSIONS:
        raise ConfigError(f"unknown version {version!r}: use one of {', '.join(EVAL_VERSIONS)}")
    for name, v in (("batch_size", batch_size), ("block_size", block_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name} must be a positive integer, got {v!r}")
    return norm, eps, version


def _check_corruptions(corruptions: Any, severities: Any, baseline: Any
                       ) -> tuple[list[str] | None, dict | None, Any]:
    """``(corruption names, published -C sets, severities)`` of :func:`evaluate`'s corruption arguments (names
    or sets is None; severities as ints when names are given); a one-line ConfigError for bad ones."""
    corr_names, sets = None, None
    if corruptions is not None and corruptions is not False:
        if isinstance(corruptions, dict):
            sets = corruptions
        else:
            corr_names = _corr.resolve_names(corruptions)
            severities = tuple(int(s) for s in severities)
            if not severities or any(s not in (1, 2, 3, 4, 5) for s in severities):
                raise ConfigError(f"severities must be values in 1-5, got {severities!r}")
    if baseline is not None and not isinstance(baseline, (nn.Module, CorruptionResult)):
        raise ConfigError("baseline must be a model or a CorruptionResult")
    if baseline is not None and corruptions is None:
        raise ConfigError("a baseline is only used for the mCE: pass corruptions too")
    return corr_names, sets, severities

def _count_classes(model: nn.Module, data: DataLike, device: torch.device
                   ) -> tuple[int, tuple[torch.Tensor, torch.Tensor]]:
    """The number of classes of ``model``, from one forward pass on the first images of ``data``, before any
    work, and those images and labels (at most :data:`PROBE_IMAGES`, on the device, for the probe): a one-line
    DataError for empty or unlabelled data, ConfigError for fewer than 2 logits."""
    first = next(iter(iter_batches(data, PROBE_IMAGES)), None)
    if first is None or first[0].shape[0] == 0:
        raise DataError("the data set is empty: check the split and the path")
    if first[1] is None:
        raise DataError("evaluate needs labels: pass (x, y) or a labelled data set")
    check_images(first[0])
    with eval_mode(model), torch.no_grad():
        probe = check_logits(forward(model, first[0][:1].to(device).float()))  # NaN/inf logits: no result at all
    if probe.dim() != 2 or probe.shape[1] < 2:
        raise ConfigError(f"the model returns outputs of shape {tuple(probe.shape[1:])}: evaluate needs logits "
                          "for at least 2 classes")
    x = first[0].to(device).float()
    y = check_labels(first[1].to(device), x.shape[0], int(probe.shape[1])).long()
    return int(probe.shape[1]), (x, y)



def _settings(steps: list[PlanStep], tally: Tally, *, version: str, plan: str, norm: str, eps: float,
              num_classes: int, seed: int, batch_size: int, block_size: int, device: torch.device, amp: str | None,
              forwards: int, bpda: Any, surrogate: bool) -> dict[str, Any]:
    """What :func:`evaluate` ran: its arguments, the plan chosen, each attack with its parameters, seed and which
    survivors it attacks, the attacks of the version left out for the model, and how many blocks escalated."""
    settings: dict[str, Any] = {
        "version": version, "plan": plan, "norm": norm, "eps": eps, "num_classes": num_classes, "seed": seed,
        "batch_size": batch_size, "block_size": block_size, "device": str(device), **({"amp": amp} if amp else {}),
        "forwards": forwards,
        "attacks": [{"name": s.name, "attack": s.attack, "params": dict(s.params), "seed": seed + k,
                     **({"only": s.only} if s.only != "all" else {}), **({"surrogate": True} if s.on_surrogate else {})}
                    for k, s in enumerate(steps)],
    }
    if bpda:
        settings["bpda"] = bpda if isinstance(bpda, str) else (sorted(bpda) if isinstance(bpda, dict) else list(bpda))
    if surrogate:
        settings["surrogate"] = True
    if any(s.only in ("probe", "escalate") for s in steps):
        settings["escalated_blocks"] = tally.escalated
        settings["blocks"] = tally.blocks
    skipped = {**skipped_attacks(plan if plan in ("standard", "fast", "rand", "auto") else version, steps,
                                 num_classes), **tally.skipped}
    if skipped:
        settings["skipped"] = skipped
    return settings


def _result(parts: dict[str, torch.Tensor | None], tally: Tally, settings: dict[str, Any], *, eps: float,
            norm: str, version: str, keep_adv: bool) -> EvalResult:
    """The :class:`EvalResult` of the gathered per-sample ``parts`` and the summed ``tally``."""
    y = parts["y"]
    n = int(y.shape[0])
    code = parts["code"]
    clean_correct = code != -2
    labels = list(tally.breaks)
    broken_by = ["" if c == -1 else "misclassified" if c == -2 else labels[c] for c in code.tolist()]
    cum = int(clean_correct.sum())
    per_attack = {}
    for name in labels:
        cum -= tally.breaks[name]
        per_attack[name] = cum / n
    ran = [s["name"] for s in settings["attacks"] if s.get("only", "all") == "all" or tally.attacked[s["name"]]]
    per_attack = {k: per_attack[k] for k in ran}  # conditional steps (probe, escalation) only where they ran
    timings = {"clean_s": tally.clean_s, "checks_s": tally.checks_s,
               **{f"{k}_s": tally.seconds[k] for k in ran}}
    return EvalResult(
        eps=eps, norm=norm, version=version, clean_accuracy=float(clean_correct.double().mean()),
        robust_accuracy=float((code == -1).double().mean()), attacks=per_attack,
        breaks={k: tally.breaks[k] for k in ran}, attacked={k: tally.attacked[k] for k in ran},
        index=parts["index"].long(), y=y, clean_pred=parts["clean_pred"],
        adv_pred=parts["adv_pred"], clean_correct=clean_correct, robust=code == -1, broken_by=broken_by,
        linf=parts["linf"], l2=parts["l2"], adv=parts["adv"] if keep_adv else None,
        gradient=[_GRAD_NAMES.get(int(g), "") for g in parts["grad"].tolist()], settings=settings, timings=timings)


# ------------------------------------------------------------------------------------------------ curves
def _remapped(flags: list[Flag], index: torch.Tensor, eps: float) -> list[Flag]:
    """``flags`` of an evaluation on a subset whose row j is sample ``index[j]`` of the whole, for radius ``eps``."""
    return [Flag(f.name, f.severity, f"eps {eps:g}: {f.message}", f.remedy,
                 tuple(int(index[i]) for i in f.samples)) for f in flags]


def _curve_point(res: EvalResult, eps: float, n: int, robust_before: int) -> dict[str, Any]:
    return {"eps": eps, "robust_accuracy": float(res.robust.sum()) / n if n else float("nan"),
            "attacked": robust_before, "broke": robust_before - int(res.robust.sum()), "plan": res.plan,
            "reliable": res.reliable, "flags": [f.to_dict() for f in res.flags],
            "seconds": res.timings.get("total_s", 0.0)}


def _evaluate_curve(model: nn.Module, data: DataLike, radii: list[Any], kw: dict[str, Any],
                    corr: dict[str, Any]) -> EvalResult:
    """:func:`evaluate` at every radius of ``radii`` (ascending), each on the survivors of the smaller one; the
    result at the largest radius with the curve (see :func:`evaluate`)."""
    t0 = time.perf_counter()
    norm = check_norm(kw["norm"])
    if not radii:
        raise ConfigError("eps is an empty list: give at least one radius")
    radii = sorted({check_eps("eps", e, norm) for e in radii})
    x, y = as_tensors(data)
    if y is None:
        raise DataError("evaluate needs labels: pass (x, y) or a labelled data set")
    res = evaluate(model, (x, y), radii[0], **kw, **corr)
    n = res.num_samples
    curve = [_curve_point(res, radii[0], n, int(res.clean_correct.sum()))]
    flags = _remapped(res.flags, res.index, radii[0]) if len(radii) > 1 else list(res.flags)
    broken_at = torch.full((n,), float("nan"), dtype=torch.float64)
    broken_at[~res.robust] = radii[0]
    broken_at[~res.clean_correct] = 0.0
    for e in radii[1:]:
        pos = res.robust.nonzero().flatten()
        sub = evaluate(model, (x[pos], y[pos]), e, **kw) if pos.numel() else None
        if sub is None:
            curve.append({"eps": e, "robust_accuracy": 0.0, "attacked": 0, "broke": 0, "plan": res.plan,
                          "reliable": True, "flags": [], "seconds": 0.0})
            continue
        curve.append(_curve_point(sub, e, n, int(pos.numel())))
        flags += _remapped(sub.flags, res.index[pos], e)
        _merge(res, sub, pos, e, broken_at, n)
    res.eps, res.curve, res.flags, res.broken_at = radii[-1], curve, flags, broken_at
    res.robust_accuracy = float(res.robust.double().mean())
    res.settings["eps"] = radii
    res.timings["total_s"] = time.perf_counter() - t0
    return res


def _merge(res: EvalResult, sub: EvalResult, pos: torch.Tensor, eps: float, broken_at: torch.Tensor, n: int) -> None:
    """Write the evaluation ``sub`` of the survivors ``pos`` (positions in ``res``) at radius ``eps`` into ``res``:
    per-sample outcomes, the largest radius's per-attack figures (as fractions of all ``n`` samples)."""
    broke = ~sub.robust
    hit = pos[broke]
    res.robust[hit] = False
    broken_at[hit] = eps
    res.adv_pred[hit] = sub.adv_pred[broke]
    res.linf[hit], res.l2[hit] = sub.linf[broke], sub.l2[broke]
    if res.adv is not None and sub.adv is not None:
        res.adv[hit] = sub.adv[broke]
    for j, p in enumerate(pos.tolist()):
        if broke[j]:
            res.broken_by[p] = sub.broken_by[j]
    m = int(pos.numel())
    res.attacks = {k: v * m / n for k, v in sub.attacks.items()}
    res.breaks, res.attacked = dict(sub.breaks), dict(sub.attacked)
    res.plan = sub.plan
    for k, v in sub.timings.items():
        if k != "total_s":
            res.timings[k] = res.timings.get(k, 0.0) + v


def _add_corruptions(result: EvalResult, model: nn.Module, data: DataLike, *, corr_names: list[str] | None,
                     sets: dict | None, severities: Any, baseline: Any, seed: int, batch_size: int) -> None:
    """Measure accuracy under corruptions (the named ones at ``severities``, or the published ``sets``) and, with
    a ``baseline``, the mCE; fills ``result.corruption``, its settings and ``corruptions_s``."""
    t0 = time.perf_counter()
    settings = result.settings
    if sets is not None:
        res = published_corruptions(model, sets, result.clean_accuracy, batch_size)
        base = baseline
        if isinstance(baseline, nn.Module):
            base = published_corruptions(baseline, sets, float(accuracy(baseline, data, batch_size=batch_size)),
                                         batch_size)
        settings["corruptions"] = {"source": "published", "names": sorted(res.accuracy)}
    else:
        res = corruption_accuracy(model, data, corruptions=corr_names, severities=severities, seed=seed,
                                  batch_size=batch_size)
        base = baseline
        if isinstance(baseline, nn.Module):
            base = corruption_accuracy(baseline, data, corruptions=corr_names, severities=severities, seed=seed,
                                       batch_size=batch_size)
        settings["corruptions"] = {"source": "robustest.corruptions", "names": corr_names,
                                   "severities": list(severities), "seed": seed}
    if baseline is not None:
        settings["corruptions"]["baseline"] = "model" if isinstance(baseline, nn.Module) else "given errors"
    result.corruption = corruption_summary(res, base)
    result.timings["corruptions_s"] = time.perf_counter() - t0


#: the command line of evaluate's options (``robustest eval``; defaults: the signature's)
EVALUATE_OPTIONS = {
    "norm": spec("choice", "threat model", choices=("linf", "l2")),
    "version": spec("choice", "attack ensemble (auto = fast, checked and escalated where a probe finds masking; "
                    "standard = AutoAttack's)", choices=EVAL_VERSIONS),
    "n_targets": spec("positive-int", "target classes of APGD-T and FAB-T", metavar="K", shown="min(9, classes - 1)"),
    "corruptions": spec("text", "also measure accuracy under common corruptions: 'all', a group or names",
                        metavar="LIST"),
    "bpda": spec("text", "submodules (dotted names) whose backward pass the attacks replace by the identity (BPDA, "
                 "for non-differentiable preprocessing), e.g. quant or pre.0", metavar="LIST"),
    "forwards": spec("positive-int", "forward passes judging each point, the majority deciding", metavar="R",
                     shown="1, or 11 for a model found randomised"),
    "amp": spec("choice", "run the clean pass in bf16 (CPU or CUDA) or fp16 (CUDA) autocast; the attacks stay in "
                "float32", choices=AMP_MODES, shown="float32"),
    "block_size": spec("positive-int", "images read and attacked per block (memory stays bounded; under torchrun the "
                       "ranks share out whole blocks)", metavar="N"),
}
