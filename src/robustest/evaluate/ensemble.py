"""``evaluate``: a standard robustness evaluation, the AutoAttack ensemble run per sample on the points still
robust, with clean, per-attack and worst-case robust accuracy and, optionally, accuracy under common corruptions.

Follows Croce & Hein (2020, "Reliable evaluation of adversarial robustness with an ensemble of diverse
parameter-free attacks"): the attacks run in order (standard: APGD-CE -> APGD-T -> FAB-T -> Square), each only on
the samples that every earlier attack left correctly classified, so the robust accuracy is the per-sample worst
case and the accuracy after each attack is cumulative.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from robustest import corruptions as _corr
from robustest.attacks import BATCH_SEED_STRIDE, attack_function, canonical_name, check_norm, lp_norm
from robustest.core import distributed
from robustest.core.amp import autocast, check_amp
from robustest.core.batching import DataLike, batch_origin, iter_batches
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError, DataError
from robustest.core.inputs import check_images, check_labels, check_logits
from robustest.core.modelcall import eval_mode, forward
from robustest.core.progress import progress as _progress
from robustest.core.seeding import make_generator
from robustest.core.validation import check_eps
from robustest.evaluate.clean import accuracy
from robustest.evaluate.corruption import (
    CorruptionResult,
    corruption_accuracy,
    corruption_summary,
    published_corruptions,
)

__all__ = ["AUTOATTACK_NAMES", "EVAL_FORMAT", "EVAL_VERSIONS", "EvalResult", "ensemble_plan",
           "evaluate"]

EVAL_FORMAT = "robustest-eval-results"
EVAL_VERSIONS = ("standard", "fast", "custom")
#: AutoAttack's names of the ensemble attacks -> robustest registry names
AUTOATTACK_NAMES = {"apgd-ce": "apgd", "apgd-dlr": "apgd_dlr", "apgd-t": "apgd_t", "fab": "fab", "fab-t": "fab_t",
                    "square": "square"}
_STANDARD = (("apgd-ce", {"steps": 100, "restarts": 1, "rho": 0.75}),
             ("apgd-t", {"steps": 100, "restarts": 1, "rho": 0.75, "n_targets": 9}),
             ("fab-t", {"steps": 100, "restarts": 1, "n_targets": 9}),
             ("square", {"queries": 5000, "p_init": 0.8, "restarts": 1}))
_FAST = (("apgd-ce", {"steps": 100, "restarts": 1, "rho": 0.75}),
         ("apgd-t", {"steps": 100, "restarts": 1, "rho": 0.75, "n_targets": 3}))


@dataclass
class _Step:
    name: str  # display name (AutoAttack's for its attacks, else the registry name)
    attack: str  # registry name
    fn: Any
    params: dict[str, Any]


def ensemble_plan(version: str = "standard", norm: str = "linf", attacks: Any = None, *,
                  n_targets: int | None = None, num_classes: int | None = None) -> list[tuple[str, str, dict]]:
    """The attacks :func:`evaluate` runs, in order, as ``(display name, registry name, parameters)``.

    ``standard`` (AutoAttack's standard version, Croce & Hein 2020): APGD-CE (100 steps, 1 run), APGD-T (100
    steps, the 9 most likely other classes, 1 run each), FAB-T (100 steps, 9 target classes, 1 run each) and
    Square (5000 queries, p_init 0.8). ``fast``: APGD-CE (100 steps) and APGD-T on the 3 most likely other
    classes. ``custom``: ``attacks``, a list of names (AutoAttack's ``apgd-ce``, ``apgd-dlr``, ``apgd-t``,
    ``fab``, ``fab-t``, ``square`` or any :func:`robustest.attacks.names`) or ``(name, {param: value})`` pairs.
    ``n_targets`` replaces the number of target classes of APGD-T and FAB-T; by default it is
    ``min(9, classes - 1)``. With fewer than 4 classes APGD-T is left out (its loss needs 4 logits).
    Attacks that can (APGD, FAB) stop working on a sample once it is broken (``stop_on_success``; AutoAttack
    runs every sample for all steps: the same samples are broken, at less cost).
    """
    version = str(version).lower()
    if version not in EVAL_VERSIONS:
        raise ConfigError(f"unknown version {version!r}: use one of {', '.join(EVAL_VERSIONS)}")
    if version != "custom" and attacks:
        raise ConfigError(f"attacks are chosen by version={version!r}; pass version='custom' to choose them")
    if version == "custom":
        if not attacks:
            raise ConfigError("version='custom' needs attacks: e.g. ['apgd-ce', 'square']")
        items = [a if isinstance(a, (tuple, list)) else (a, {}) for a in
                 ([attacks] if isinstance(attacks, str) else attacks)]
    else:
        items = [(n, dict(p)) for n, p in (_STANDARD if version == "standard" else _FAST)]
    if n_targets is not None:
        if isinstance(n_targets, bool) or not isinstance(n_targets, int) or n_targets < 1:
            raise ConfigError(f"n_targets must be a positive integer, got {n_targets!r}")
        if num_classes is not None and n_targets > num_classes - 1:
            raise ConfigError(f"n_targets={n_targets} but the model has {num_classes} classes: use at most "
                              f"{num_classes - 1}")
    plan: list[tuple[str, str, dict]] = []
    for item in items:
        if len(item) != 2 or not isinstance(item[1], dict):
            raise ConfigError(f"an attack is a name or a (name, params) pair, got {item!r}")
        raw, params = str(item[0]), dict(item[1])
        key = raw.lower().replace("_", "-")
        reg = AUTOATTACK_NAMES.get(key) or canonical_name(raw)
        display = key if key in AUTOATTACK_NAMES else reg
        fn = attack_function(reg)
        sig = inspect.signature(fn).parameters
        bad = [p for p in params if p not in sig or p in ("model", "x", "y", "eps", "norm", "seed", "generator",
                                                            "batch_size", "target")]
        if bad:
            raise ConfigError(f"attack {display!r} does not take parameter(s) {', '.join(bad)}")
        if "stop_on_success" in sig:
            params.setdefault("stop_on_success", True)  # a broken sample needs no more steps
        if "norm" in sig:
            params["norm"] = norm
        elif norm != "linf" and reg != "cw_l2":
            raise ConfigError(f"attack {display!r} is L-inf only: use it with norm='linf'")
        elif reg == "cw_l2" and norm != "l2":
            raise ConfigError("attack 'cw_l2' is an L2 attack: use it with norm='l2'")
        if "n_targets" in sig:
            k = n_targets if n_targets is not None else params.get("n_targets", 9)
            if num_classes is not None:
                if reg == "apgd_t" and num_classes < 4:
                    if version == "custom":
                        raise ConfigError(f"apgd-t needs a model with at least 4 classes, this one has {num_classes}")
                    continue
                if n_targets is None and (version != "custom" or "n_targets" not in item[1]):
                    k = min(k, num_classes - 1)  # the default (9) adapts to the model
                if k > num_classes - 1:
                    raise ConfigError(f"{display}: n_targets={k} but the model has {num_classes} classes: use at "
                                      f"most {num_classes - 1}")
            params["n_targets"] = k
        if reg == "apgd_dlr" and num_classes is not None and num_classes < 3:
            raise ConfigError(f"apgd-dlr needs a model with at least 3 classes, this one has {num_classes}")
        plan.append((display, reg, params))
    names_seen = [p[0] for p in plan]
    if len(set(names_seen)) != len(names_seen):
        dup = sorted({n for n in names_seen if names_seen.count(n) > 1})
        raise ConfigError(f"attack(s) {', '.join(dup)} listed twice: give each attack once")
    return plan


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
    * ``corruption``: corruption accuracy summary (:func:`evaluate` with ``corruptions``), else None.
    * ``settings`` (what was run), ``timings`` (seconds).
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
    corruption: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])

    def __repr__(self) -> str:
        per = ", ".join(f"{k} {100 * v:.2f}%" for k, v in self.attacks.items())
        corr = ""
        if self.corruption:
            corr = f"; corruptions {100 * self.corruption['mean_corruption_accuracy']:.2f}%"
        return (f"EvalResult({self.norm} eps={self.eps:g}, {self.version}, n={self.num_samples}: clean "
                f"{100 * self.clean_accuracy:.2f}%, robust {100 * self.robust_accuracy:.2f}% [{per}]{corr})")

    def rows(self) -> list[dict[str, Any]]:
        """One dict per sample (index, label, clean_pred, clean_correct, adv_pred, robust, broken_by, linf, l2)."""
        cols = zip(self.index.tolist(), self.y.tolist(), self.clean_pred.tolist(), self.clean_correct.tolist(),
                   self.adv_pred.tolist(), self.robust.tolist(), self.broken_by, self.linf.tolist(), self.l2.tolist())
        return [{"index": i, "label": y, "clean_pred": cp, "clean_correct": int(cc), "adv_pred": ap,
                 "robust": int(r), "broken_by": b, "linf": li, "l2": l2} for i, y, cp, cc, ap, r, b, li, l2 in cols]

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
        }
        if self.corruption is not None:
            out["corruptions"] = {k: v for k, v in self.corruption.items() if k not in ("result", "baseline_result")}
        out["settings"] = dict(self.settings)
        out["timings"] = dict(self.timings)
        out["robustbench"] = self.robustbench()
        return out

    def robustbench(self, **info: Any) -> dict[str, Any]:
        """The fields of a RobustBench ``model_info`` entry this evaluation fills (accuracies as percent strings
        with two decimals, as RobustBench writes them); ``info`` fills the descriptive ones (name, dataset, ...).
        ``autoattack_acc`` is set only for ``version="standard"`` (the other versions are not AutoAttack)."""
        aa = f"{100 * self.robust_accuracy:.2f}" if self.version == "standard" else None
        entry: dict[str, Any] = {"link": None, "name": None, "authors": None, "additional_data": None,
                                 "number_forward_passes": 1, "dataset": None, "venue": None, "architecture": None,
                                 "eps": f"{self.eps:g}", "clean_acc": f"{100 * self.clean_accuracy:.2f}",
                                 "reported": None, "autoattack_acc": aa}
        if self.corruption is not None:
            entry["corruptions_acc"] = f"{100 * self.corruption['mean_corruption_accuracy']:.2f}"
            mce = self.corruption.get("mce")
            entry["corruptions_mce"] = None if mce is None else f"{100 * mce:.2f}"
        entry.update(info)
        return entry


def _quantiles(t: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    v = t[mask].double()
    if v.numel() == 0:
        return {}
    return {"mean": float(v.mean()), "median": float(v.median()), "max": float(v.max())}



# ------------------------------------------------------------------------------------------------ evaluate
def evaluate(model: nn.Module, data: DataLike, eps: float, norm: str = "linf", version: str = "standard",
             attacks: Any = None, *, n_targets: int | None = None, seed: int = 0, batch_size: int = 256,
             block_size: int = 4096, corruptions: Any = None, severities: Any = (1, 2, 3, 4, 5),
             baseline: Any = None, keep_adv: bool = False, progress: bool = False,
             amp: str | None = None) -> EvalResult:
    """Evaluate the robustness of ``model`` on labelled ``data`` at radius ``eps`` (L-inf or L2, pixel scale).

    Runs the attacks of :func:`ensemble_plan` (``version`` "standard": APGD-CE -> APGD-T -> FAB-T -> Square,
    AutoAttack's standard version; "fast": APGD-CE -> APGD-T on 3 target classes; "custom": ``attacks``) in
    order, each only on the samples still classified correctly (clean misclassifications are never attacked), and
    counts a sample as broken only when the attack's point is misclassified and inside the eps-ball. Returns an
    :class:`EvalResult` with clean accuracy, cumulative robust accuracy after each attack, the worst case, the
    attack that broke each sample and timings.

    ``data``: anything :func:`robustest.core.batching.iter_batches` takes, with labels (images N x C x H x W in [0, 1],
    int64 labels [N]); it is processed in blocks of ``block_size`` images (memory stays bounded), the attacks in
    batches of ``batch_size``. Attack k on block b draws its randomness from a ``torch.Generator`` on the
    model's device seeded ``seed + k + b * BATCH_SEED_STRIDE`` (the first block: ``seed + k``), so the same
    seed, data and sizes give the same result, and under torchrun (each rank evaluates whole blocks of its
    share; per-sample results are gathered on every rank, counts summed, timings summed over the ranks) the
    same result as one process.

    ``corruptions``: None; ``"all"``, a group or a list of names (the 19 common corruptions of
    :mod:`robustest.corruptions` at ``severities``, via :func:`robustest.evaluate.corruption_accuracy`); or
    published -C data as ``{corruption: {severity: labelled data}}`` (e.g. from ``robustest.data``'s -C
    loaders). ``baseline``: a model (or a :class:`robustest.evaluate.CorruptionResult`) whose corruption errors
    normalise the mCE. ``keep_adv`` keeps the worst-case images (N x C x H x W) in the result.

    ``amp``: "bf16" (CPU or CUDA) or "fp16" (CUDA) runs the clean pass (the predictions that decide which
    samples are attacked) under ``torch.autocast``; the attacks and their predictions stay in float32. A
    sample on the decision boundary may then count as a clean error that float32 classifies correctly.

    Bad input (raised before any attack runs, as one-line ConfigError/DataError): eps <= 0 (or > 1 for L-inf),
    an unknown norm or version, a model with fewer than 2 outputs, more target classes than classes - 1.
    """
    t_start = time.perf_counter()
    norm, eps, version = _check_arguments(model, eps, norm, version, batch_size, block_size)
    corr_names, sets, severities = _check_corruptions(corruptions, severities, baseline)
    device = resolve_device(model)
    amp = check_amp(amp, device)
    num_classes = _count_classes(model, data, device)
    plan = ensemble_plan(version, norm, attacks, n_targets=n_targets, num_classes=num_classes)
    steps = [_Step(d, r, attack_function(r), p) for d, r, p in plan]
    tally = _attack_blocks(model, data, steps, num_classes, eps=eps, norm=norm, seed=seed, batch_size=batch_size,
                           block_size=block_size, amp=amp, device=device, keep_adv=keep_adv, progress=progress)
    parts = _gather(tally)
    settings = _settings(steps, version=version, norm=norm, eps=eps, num_classes=num_classes, seed=seed,
                         batch_size=batch_size, block_size=block_size, device=device, amp=amp)
    result = _result(parts, tally, settings, eps=eps, norm=norm, version=version, keep_adv=keep_adv)
    if corr_names is not None or sets is not None:
        _add_corruptions(result, model, data, corr_names=corr_names, sets=sets, severities=severities,
                         baseline=baseline, seed=seed, batch_size=batch_size)
    result.timings["total_s"] = time.perf_counter() - t_start
    return result


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


def _count_classes(model: nn.Module, data: DataLike, device: torch.device) -> int:
    """The number of classes of ``model``, from one forward pass on the first image of ``data``, before any
    work: a one-line DataError for empty or unlabelled data, ConfigError for fewer than 2 logits."""
    first = next(iter(iter_batches(data, 1)), None)
    if first is None or first[0].shape[0] == 0:
        raise DataError("the data set is empty: check the split and the path")
    if first[1] is None:
        raise DataError("evaluate needs labels: pass (x, y) or a labelled data set")
    check_images(first[0])
    with eval_mode(model), torch.no_grad():
        probe = check_logits(forward(model, first[0].to(device).float()))  # NaN/inf logits: no result at all
    if probe.dim() != 2 or probe.shape[1] < 2:
        raise ConfigError(f"the model returns outputs of shape {tuple(probe.shape[1:])}: evaluate needs logits "
                          "for at least 2 classes")
    return int(probe.shape[1])


#: the per-sample results of :func:`evaluate`, in the order they are gathered
_PARTS = ("index", "y", "clean_pred", "adv_pred", "code", "linf", "l2", "adv")


@dataclass
class _Tally:
    """What the blocks of one :func:`evaluate` add up: per-sample parts (CPU tensors, one per block; ``code`` is
    -2 for a clean error, -1 for robust, else the index of the attack that broke the sample), per-attack counts
    and seconds, and the seconds of the clean pass."""

    parts: dict[str, list[torch.Tensor]]
    breaks: dict[str, int]
    attacked: dict[str, int]
    seconds: dict[str, float]
    clean_s: float = 0.0

    @classmethod
    def start(cls, steps: list[_Step]) -> _Tally:
        return cls(parts={k: [] for k in _PARTS}, breaks={s.name: 0 for s in steps},
                   attacked={s.name: 0 for s in steps}, seconds={s.name: 0.0 for s in steps})


def _predicted(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Predicted labels (int64 [N]) of ``x`` (N x C x H x W) in batches of ``batch_size`` (caller sets the mode)."""
    return torch.cat([forward(model, x[s:s + batch_size]).argmax(1) for s in range(0, x.shape[0], batch_size)])


def _attack_blocks(model: nn.Module, data: DataLike, steps: list[_Step], num_classes: int, *, eps: float,
                   norm: str, seed: int, batch_size: int, block_size: int, amp: str | None, device: torch.device,
                   keep_adv: bool, progress: bool) -> _Tally:
    """Run the ensemble over ``data`` in blocks of ``block_size`` images (this rank's share under torchrun),
    attack k on block b seeded ``seed + k + b * BATCH_SEED_STRIDE``."""
    tally = _Tally.start(steps)
    shard = distributed.Shard.current()
    block, pos = batch_origin(data, block_size, shard)
    for idx, xb, yb in iter_batches(data, block_size, device, with_index=True, shard=shard):
        b, pos = pos // block, pos + len(idx)
        gens = [make_generator(seed + k + b * BATCH_SEED_STRIDE, device) for k in range(len(steps))]
        if yb is None:
            raise DataError("evaluate needs labels: pass (x, y) or a labelled data set")
        xb = check_images(xb).float()
        yb = check_labels(yb, xb.shape[0], num_classes).long()
        t0 = time.perf_counter()
        with eval_mode(model), torch.no_grad(), autocast(amp, device):
            cp = _predicted(model, xb, batch_size)
        tally.clean_s += time.perf_counter() - t0
        ap, code, adv = _attack_block(model, xb, yb, cp, steps, gens, tally, eps=eps, norm=norm,
                                      batch_size=batch_size, progress=progress)
        delta = (adv - xb).flatten(1)
        block_parts = {"index": idx, "y": yb, "clean_pred": cp, "adv_pred": ap, "code": code,
                       "linf": delta.abs().amax(1), "l2": delta.norm(dim=1)}
        if keep_adv:
            block_parts["adv"] = adv
        for k_, v in block_parts.items():
            tally.parts[k_].append(v.cpu())
    return tally


def _attack_block(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor, cp: torch.Tensor, steps: list[_Step],
                  gens: list[torch.Generator], tally: _Tally, *, eps: float, norm: str, batch_size: int,
                  progress: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attacks in order on one block (images ``xb`` B x C x H x W, labels ``yb`` and clean predictions ``cp``
    [B]), each on the samples still robust. Returns ``(adv_pred [B], code [B], adv B x C x H x W)``: the worst
    case found per sample (the clean input where none broke it); counts and seconds go to ``tally``."""
    tol = eps * 1e-6 + 1e-6
    robust = cp == yb
    code = torch.where(robust, -1, -2)
    adv = xb.clone()
    ap = cp.clone()
    for k, step in enumerate(_progress(steps, enabled=progress, desc="evaluate", unit="attack")):
        sel = robust.nonzero().flatten()
        if sel.numel() == 0:
            break
        t0 = time.perf_counter()
        out = step.fn(model, xb[sel], yb[sel], eps, generator=gens[k], batch_size=batch_size, **step.params)
        with eval_mode(model), torch.no_grad():
            pred = _predicted(model, out, batch_size)
        dist = lp_norm(out - xb[sel], norm)
        broke = (pred != yb[sel]) & (dist <= eps + tol)
        hit = sel[broke]
        robust[hit] = False
        code[hit] = k
        adv[hit] = out[broke]
        ap[hit] = pred[broke]
        tally.seconds[step.name] += time.perf_counter() - t0
        tally.breaks[step.name] += int(hit.numel())
        tally.attacked[step.name] += int(sel.numel())
    return ap, code, adv


def _gather(tally: _Tally) -> dict[str, torch.Tensor | None]:
    """The per-sample parts of every rank, in data order (None for a part no block kept); under torchrun the
    counts and seconds in ``tally`` become sums over the ranks."""
    parts = distributed.all_gather_cat({k: torch.cat(v) if v else None for k, v in tally.parts.items()})
    if distributed.world_size() > 1:  # counts and compute time of every rank
        for counts in (tally.breaks, tally.attacked, tally.seconds):
            every = distributed.all_gather_objects(dict(counts))
            for k_ in counts:
                counts[k_] = sum(t[k_] for t in every)
        tally.clean_s = sum(distributed.all_gather_objects(tally.clean_s))
    return parts


def _settings(steps: list[_Step], *, version: str, norm: str, eps: float, num_classes: int, seed: int,
              batch_size: int, block_size: int, device: torch.device, amp: str | None) -> dict[str, Any]:
    """What :func:`evaluate` ran: its arguments, each attack with its parameters and seed, and the attacks of
    the version left out for the model (APGD-T with fewer than 4 classes)."""
    settings: dict[str, Any] = {
        "version": version, "norm": norm, "eps": eps, "num_classes": num_classes, "seed": seed,
        "batch_size": batch_size, "block_size": block_size, "device": str(device), **({"amp": amp} if amp else {}),
        "attacks": [{"name": s.name, "attack": s.attack, "params": dict(s.params), "seed": seed + k}
                    for k, s in enumerate(steps)],
    }
    labels = [s.name for s in steps]
    skipped = [d for d, _ in (_STANDARD if version == "standard" else _FAST if version == "fast" else ())
               if d not in labels]
    if skipped:
        settings["skipped"] = {d: f"needs at least 4 classes, the model has {num_classes}" for d in skipped}
    return settings


def _result(parts: dict[str, torch.Tensor | None], tally: _Tally, settings: dict[str, Any], *, eps: float,
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
    timings = {"clean_s": tally.clean_s, **{f"{k}_s": v for k, v in tally.seconds.items()}}
    return EvalResult(
        eps=eps, norm=norm, version=version, clean_accuracy=float(clean_correct.double().mean()),
        robust_accuracy=float((code == -1).double().mean()), attacks=per_attack, breaks=tally.breaks,
        attacked=tally.attacked, index=parts["index"].long(), y=y, clean_pred=parts["clean_pred"],
        adv_pred=parts["adv_pred"], clean_correct=clean_correct, robust=code == -1, broken_by=broken_by,
        linf=parts["linf"], l2=parts["l2"], adv=parts["adv"] if keep_adv else None, settings=settings,
        timings=timings)


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
