"""``evaluate``: a standard robustness evaluation, the AutoAttack ensemble run per sample on the points still
robust, with clean, per-attack and worst-case robust accuracy and, optionally, accuracy under common corruptions.

Follows Croce & Hein (2020, "Reliable evaluation of adversarial robustness with an ensemble of diverse
parameter-free attacks"): the attacks run in order (standard: APGD-CE -> APGD-T -> FAB-T -> Square), each only on
the samples that every earlier attack left correctly classified, so the robust accuracy is the per-sample worst
case and the accuracy after each attack is cumulative. Re-exported by :mod:`robustest.robustness`.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from robustest.core.batching import DataLike
from robustest.core.errors import ConfigError, DataError
from robustest.core.validation import check_eps

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
    from robustest import attacks as _atk

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
        reg = AUTOATTACK_NAMES.get(key) or _atk._canonical_name(raw)
        display = key if key in AUTOATTACK_NAMES else reg
        fn = _atk._REGISTRY[reg].fn
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


# ------------------------------------------------------------------------------------------ corruptions
def _corruption_summary(res: Any, base: Any | None) -> dict[str, Any]:
    """Mean corruption accuracy / error and, with a baseline, Hendrycks & Dietterich's (2019) normalised mCE
    (mean over corruptions of sum_s E_model / sum_s E_baseline) and relative mCE
    (sum_s (E_model - E_model_clean) / sum_s (E_baseline - E_baseline_clean))."""
    out: dict[str, Any] = {
        "corruptions": list(res.accuracy), "severities": list(res.severities), "num_samples": res.num_samples,
        "table": res.table, "mean_corruption_accuracy": res.mean_corruption_accuracy,
        "mean_corruption_error": res.mce, "mce": None, "relative_mce": None,
        "accuracy": {c: {str(s): a for s, a in per.items()} for c, per in res.accuracy.items()},
        "result": res,
    }
    if base is None:
        return out
    missing = [(c, s) for c, per in res.accuracy.items() for s in per
               if c not in base.accuracy or s not in base.accuracy[c]]
    if missing:
        c, s = missing[0]
        raise ConfigError(f"the baseline has no result for {c} at severity {s}: measure it on the same corruptions")
    ce, rel = {}, {}
    for c, per in res.error.items():
        e_m = sum(per.values())
        e_b = sum(base.error[c][s] for s in per)
        ce[c] = e_m / e_b if e_b > 0 else float("nan")
        d_m = sum(e - (1.0 - res.clean_accuracy) for e in per.values())
        d_b = sum(base.error[c][s] - (1.0 - base.clean_accuracy) for s in per)
        rel[c] = d_m / d_b if d_b > 0 else float("nan")
    out.update(ce=ce, relative_ce=rel, mce=sum(ce.values()) / len(ce), relative_mce=sum(rel.values()) / len(rel),
               baseline_clean_accuracy=base.clean_accuracy, baseline_mean_corruption_error=base.mce,
               baseline_result=base)
    return out


def _published_corruptions(model: nn.Module, sets: dict, clean_accuracy: float, batch_size: int) -> Any:
    """A CorruptionResult from published -C data: ``sets[corruption][severity]`` is labelled data."""
    from robustest.core.batching import num_samples
    from robustest.robustness import CorruptionResult
    from robustest.training import accuracy

    acc: dict[str, dict[int, float]] = {}
    n = 0
    sevs: set[int] = set()
    for c, per in sets.items():
        if not isinstance(per, dict) or not per:
            raise ConfigError(f"corruptions[{c!r}] must map severities (1-5) to labelled data")
        acc[str(c)] = {}
        for s, d in per.items():
            if int(s) not in (1, 2, 3, 4, 5):
                raise ConfigError(f"severity {s} of {c!r} is outside 1-5")
            acc[str(c)][int(s)] = float(accuracy(model, d, batch_size=batch_size))
            sevs.add(int(s))
            n = max(n, num_samples(d))
    return CorruptionResult(accuracy=acc, clean_accuracy=clean_accuracy, num_samples=n,
                            severities=tuple(sorted(sevs)), seed=0, table="published")


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
    :mod:`robustest.corruptions` at ``severities``, via :func:`robustest.robustness.corruption_accuracy`); or
    published -C data as ``{corruption: {severity: labelled data}}`` (e.g. from ``robustest.data``'s -C
    loaders). ``baseline``: a model (or a :class:`robustest.robustness.CorruptionResult`) whose corruption errors
    normalise the mCE. ``keep_adv`` keeps the worst-case images (N x C x H x W) in the result.

    ``amp``: "bf16" (CPU or CUDA) or "fp16" (CUDA) runs the clean pass (the predictions that decide which
    samples are attacked) under ``torch.autocast``; the attacks and their predictions stay in float32. A
    sample on the decision boundary may then count as a clean error that float32 classifies correctly.

    Bad input (raised before any attack runs, as one-line ConfigError/DataError): eps <= 0 (or > 1 for L-inf),
    an unknown norm or version, a model with fewer than 2 outputs, more target classes than classes - 1.
    """
    from robustest import attacks as _atk
    from robustest import corruptions as _corr
    from robustest.attacks import BATCH_SEED_STRIDE
    from robustest.core import distributed
    from robustest.core.amp import autocast, check_amp
    from robustest.core.batching import batch_origin, iter_batches
    from robustest.core.devices import resolve_device
    from robustest.core.inputs import check_images, check_labels, check_logits
    from robustest.core.modelcall import eval_mode, forward
    from robustest.core.progress import progress as _progress
    from robustest.core.seeding import make_generator
    from robustest.robustness import CorruptionResult, corruption_accuracy

    t_start = time.perf_counter()
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(eps, torch.Tensor) and eps.dim() > 0:  # evaluate(model, x, y, eps): labels where eps goes
        raise ConfigError("evaluate(model, data, eps, ...) takes images and labels as ONE argument: call "
                          "evaluate(model, (x, y), eps)")
    norm = _atk._check_norm(norm)
    eps = check_eps("eps", eps, norm)
    version = str(version).lower()
    if version not in EVAL_VERSIONS:
        raise ConfigError(f"unknown version {version!r}: use one of {', '.join(EVAL_VERSIONS)}")
    for name, v in (("batch_size", batch_size), ("block_size", block_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name} must be a positive integer, got {v!r}")
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
    device = resolve_device(model)
    amp = check_amp(amp, device)
    # one forward pass on the first image: the number of classes, before any work
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
    num_classes = int(probe.shape[1])
    plan = ensemble_plan(version, norm, attacks, n_targets=n_targets, num_classes=num_classes)
    steps = [_Step(d, r, _atk._REGISTRY[r].fn, p) for d, r, p in plan]
    tol = eps * 1e-6 + 1e-6
    shard = distributed.Shard.current()
    block, pos = batch_origin(data, block_size, shard)

    idx_all, ys, cps, aps, codes, linfs, l2s, advs = [], [], [], [], [], [], [], []
    breaks = {s.name: 0 for s in steps}
    attacked = {s.name: 0 for s in steps}
    seconds = {s.name: 0.0 for s in steps}
    t_clean = 0.0
    for idx, xb, yb in iter_batches(data, block_size, device, with_index=True, shard=shard):
        b, pos = pos // block, pos + len(idx)
        gens = [make_generator(seed + k + b * BATCH_SEED_STRIDE, device) for k in range(len(steps))]
        if yb is None:
            raise DataError("evaluate needs labels: pass (x, y) or a labelled data set")
        xb = check_images(xb).float()
        yb = check_labels(yb, xb.shape[0], num_classes).long()
        t0 = time.perf_counter()
        with eval_mode(model), torch.no_grad(), autocast(amp, device):
            cp = torch.cat([forward(model, xb[s:s + batch_size]).argmax(1) for s in range(0, xb.shape[0], batch_size)])
        t_clean += time.perf_counter() - t0
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
                pred = torch.cat([forward(model, out[s:s + batch_size]).argmax(1)
                                  for s in range(0, out.shape[0], batch_size)])
            dist = _atk._core._lp(out - xb[sel], norm)
            broke = (pred != yb[sel]) & (dist <= eps + tol)
            hit = sel[broke]
            robust[hit] = False
            code[hit] = k
            adv[hit] = out[broke]
            ap[hit] = pred[broke]
            seconds[step.name] += time.perf_counter() - t0
            breaks[step.name] += int(hit.numel())
            attacked[step.name] += int(sel.numel())
        delta = (adv - xb).flatten(1)
        idx_all.append(idx.cpu())
        ys.append(yb.cpu())
        cps.append(cp.cpu())
        aps.append(ap.cpu())
        codes.append(code.cpu())
        linfs.append(delta.abs().amax(1).cpu())
        l2s.append(delta.norm(dim=1).cpu())
        if keep_adv:
            advs.append(adv.cpu())
    cat = (lambda ts: torch.cat(ts) if ts else None)  # noqa: E731
    parts = distributed.all_gather_cat({"index": cat(idx_all), "y": cat(ys), "clean_pred": cat(cps),
                                        "adv_pred": cat(aps), "code": cat(codes), "linf": cat(linfs),
                                        "l2": cat(l2s), "adv": cat(advs)})
    if distributed.world_size() > 1:  # counts and compute time of every rank
        for tally in (breaks, attacked, seconds):
            every = distributed.all_gather_objects(dict(tally))
            for k_ in tally:
                tally[k_] = sum(t[k_] for t in every)
        t_clean = sum(distributed.all_gather_objects(t_clean))
    y = parts["y"]
    n = int(y.shape[0])
    code = parts["code"]
    clean_correct = code != -2
    labels = [s.name for s in steps]
    broken_by = ["" if c == -1 else "misclassified" if c == -2 else labels[c] for c in code.tolist()]
    cum = int(clean_correct.sum())
    per_attack = {}
    for s in steps:
        cum -= breaks[s.name]
        per_attack[s.name] = cum / n
    timings = {"clean_s": t_clean, **{f"{k}_s": v for k, v in seconds.items()}}
    settings: dict[str, Any] = {
        "version": version, "norm": norm, "eps": eps, "num_classes": num_classes, "seed": seed,
        "batch_size": batch_size, "block_size": block_size, "device": str(device), **({"amp": amp} if amp else {}),
        "attacks": [{"name": s.name, "attack": s.attack, "params": dict(s.params), "seed": seed + k}
                    for k, s in enumerate(steps)],
    }
    skipped = [d for d, _ in (_STANDARD if version == "standard" else _FAST if version == "fast" else ())
               if d not in labels]
    if skipped:
        settings["skipped"] = {d: f"needs at least 4 classes, the model has {num_classes}" for d in skipped}
    result = EvalResult(
        eps=eps, norm=norm, version=version, clean_accuracy=float(clean_correct.double().mean()),
        robust_accuracy=float((code == -1).double().mean()), attacks=per_attack, breaks=breaks, attacked=attacked,
        index=parts["index"].long(), y=y, clean_pred=parts["clean_pred"], adv_pred=parts["adv_pred"],
        clean_correct=clean_correct, robust=code == -1, broken_by=broken_by, linf=parts["linf"],
        l2=parts["l2"], adv=parts["adv"] if keep_adv else None, settings=settings, timings=timings)
    if corr_names is not None or sets is not None:
        t0 = time.perf_counter()
        if sets is not None:
            res = _published_corruptions(model, sets, result.clean_accuracy, batch_size)
            base = baseline
            if isinstance(baseline, nn.Module):
                from robustest.training import accuracy

                base = _published_corruptions(baseline, sets, float(accuracy(baseline, data, batch_size=batch_size)),
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
        result.corruption = _corruption_summary(res, base)
        timings["corruptions_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start
    return result
