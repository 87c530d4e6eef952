"""``build_suite``: draw a small regression suite from a data split, stratified by local robustness.

Steps: (1) score every sample of the split by its local robustness under the baseline model
(:func:`robustest.weakrobust.analyze`: the mean misprediction score of noisy neighbours) and rank the samples
from weakest to most robust (:meth:`robustest.weakrobust.Analysis.order`); (2) cut the ranking into ``strata``
rank-quantile bins of equal size (as the weak-robust ``stratified`` validation set does), crossed with the class
when K allows at least two samples per (bin, class) cell; (3) allocate K samples to the strata (proportional to
N_h, or Neyman with the analysis's share of misclassified neighbours as the pilot), at least two per stratum, and
draw them without replacement; (4) run the baseline's evaluation on the K samples (the AutoAttack ensemble of
:func:`robustest.evaluate.evaluate`, optionally common corruptions and a bound-propagation certificate) and store
the samples, strata, settings and per-sample outcomes in a :class:`~robustest.suite.format.Suite`.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import torch
from torch import nn

from robustest.core.batching import DataLike, iter_batches, num_samples, take
from robustest.core.errors import ConfigError, DataError
from robustest.core.options import spec
from robustest.selection.strata import ALLOCATIONS, allocate, draw_in_strata, equal_bins, neyman_target
from robustest.suite.format import SUITE_VERSION, Suite, model_fingerprint
from robustest.suite.stats import outcome_estimates

__all__ = ["BUILD_OPTIONS", "build_suite", "data_sha256", "evaluate_outcomes", "make_strata",
           "stratified_draw"]

BY_CLASS = ("auto", "yes", "no")
MIN_PER_STRATUM = 2


def data_sha256(data: DataLike, batch_size: int = 1024) -> str:
    """SHA-256 of a whole labelled data set's content (float32 images and int64 labels, in order), streamed."""
    h = hashlib.sha256()
    n = 0
    for xb, yb in iter_batches(data, batch_size):
        h.update(xb.detach().cpu().float().contiguous().numpy().tobytes())
        if yb is not None:
            h.update(yb.detach().cpu().long().contiguous().numpy().tobytes())
        n += xb.shape[0]
    h.update(f"n={n}".encode())
    return h.hexdigest()


def make_strata(order: torch.Tensor, labels: torch.Tensor, k: int, strata: int = 4, by_class: str = "auto"
                ) -> tuple[torch.Tensor, list[dict[str, int]], bool]:
    """Strata of N samples: ``order`` (int64 [N], positions from the weakest to the most robust sample) is cut into
    ``strata`` rank-quantile bins of equal size (+-1), crossed with ``labels`` (int64 [N]) when ``by_class`` is
    "yes", or "auto" and every non-empty (bin, class) cell holds at least 2 samples and K >= 2 x cells. At most
    K // 2 bins (each stratum gets at least 2 samples). Returns (stratum id per position, int64 [N]; a
    description {"bin", "class"} per stratum, class -1 when not crossed; whether classes were crossed)."""
    if by_class not in BY_CLASS:
        raise ConfigError(f"by_class must be one of {', '.join(BY_CLASS)}, got {by_class!r}")
    n = int(order.numel())
    h = max(1, min(int(strata), k // MIN_PER_STRATUM, n))
    bins = torch.empty(n, dtype=torch.long)
    bins[order] = equal_bins(n, h)  # rank-quantile bins: the weakest n / h samples in bin 0
    crossed = False
    if by_class != "no":
        classes = torch.unique(labels)
        cell = bins * (int(classes.max()) + 1) + labels
        ids, counts = torch.unique(cell, return_counts=True)
        fits = bool((counts >= MIN_PER_STRATUM).all()) and k >= MIN_PER_STRATUM * len(ids)
        if by_class == "yes" and not fits:
            raise ConfigError(f"cannot cross {h} score strata with the classes: {len(ids)} cells need K >= "
                              f"{MIN_PER_STRATUM * len(ids)} and at least {MIN_PER_STRATUM} samples each "
                              "(use by_class='auto' or 'no', fewer strata or a larger K)")
        crossed = fits
    if crossed:
        ncls = int(labels.max()) + 1
        cell = bins * ncls + labels
        ids, stratum = torch.unique(cell, return_inverse=True)
        desc = [{"bin": int(c) // ncls, "class": int(c) % ncls} for c in ids.tolist()]
    else:
        stratum = bins
        desc = [{"bin": b, "class": -1} for b in range(h)]
    return stratum.long(), desc, crossed


def stratified_draw(analysis: Any, k: int, strata: int = 4, by_class: str = "auto",
                    allocation: str = "proportional", seed: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[dict[str, int]], bool]:
    """Draw ``k`` of the N analysed samples stratified by local robustness (:func:`make_strata` on
    ``analysis.order()`` and ``analysis.label``; :func:`allocate` proportional to N_h or Neyman with the pilot
    error rate 1 for a sample misclassified clean, else its share of misclassified neighbours; at least 2 per
    stratum), without replacement, seeded. ``analysis``: a :class:`robustest.weakrobust.Analysis` of N samples.
    Returns (positions into the analysis in increasing order, int64 [k]; stratum of every analysed sample,
    int64 [N]; samples per stratum n_h, int64 [H]; the strata's descriptions; whether classes were crossed)."""
    if allocation not in ALLOCATIONS:
        raise ConfigError(f"unknown allocation {allocation!r}: use one of {', '.join(ALLOCATIONS)}")
    n = len(analysis)
    stratum_all, desc, crossed = make_strata(analysis.order(), analysis.label, k, strata, by_class)
    h = len(desc)
    sizes = torch.bincount(stratum_all, minlength=h)
    if allocation == "neyman":
        pilot = torch.where(analysis.clean_correct, analysis.frac_misclassified.double(),
                            torch.ones(n, dtype=torch.float64))
        target = neyman_target(stratum_all, pilot, h)
    else:
        target = sizes.double()
    alloc = allocate(target, k, sizes, MIN_PER_STRATUM)
    picked = draw_in_strata(stratum_all, alloc, torch.Generator().manual_seed(int(seed)))
    return torch.sort(torch.cat(picked)).values, stratum_all, alloc, desc, crossed


def evaluate_outcomes(model: nn.Module, x: torch.Tensor, y: torch.Tensor, attack: dict[str, Any],
                      corruption: dict[str, Any], progress: bool = False,
                      certify: dict[str, Any] | None = None) -> dict[str, Any]:
    """Per-sample outcomes of ``model`` on the suite's samples ``x`` (float32 K x C x H x W) and labels ``y``:
    ``clean`` and ``robust`` (bool [K], from :func:`robustest.evaluate.evaluate` with the stored attack
    settings), ``corruption`` (bool [K, S]: correct under each stored corruption setting, the samples corrupted in
    batches of ``batch_size`` with seed ``seed + batch start``), with ``certify`` (the stored ``{"method": ibp |
    crown}``) ``certified`` (bool [K]: the certificate at the attack's eps and norm), ``seconds`` and ``flags`` (the
    evaluation's flags as dicts, :meth:`robustest.evaluate.Flag.to_dict`; sample indices are positions in the
    suite)."""
    from robustest.core.devices import resolve_device
    from robustest.core.modelcall import eval_mode, forward
    from robustest.corruptions import corrupt
    from robustest.evaluate import evaluate

    t0 = time.perf_counter()
    res = evaluate(model, (x, y), attack["eps"], norm=attack["norm"], version=attack["version"],
                   n_targets=attack.get("n_targets"), seed=attack["seed"], batch_size=attack["batch_size"],
                   progress=progress)
    t_attack = time.perf_counter() - t0
    settings = corruption.get("settings", [])
    out = torch.zeros(len(y), len(settings), dtype=torch.bool)
    if settings:
        dev = resolve_device(model)
        bs = int(attack["batch_size"])
        with eval_mode(model), torch.no_grad():
            for start in range(0, len(y), bs):
                xb, yb = x[start:start + bs].to(dev), y[start:start + bs].to(dev)
                for j, (name, sev) in enumerate(settings):
                    xc = corrupt(xb, name, int(sev), seed=int(corruption["seed"]) + start)
                    out[start:start + bs, j] = (forward(model, xc).argmax(1) == yb).cpu()
    seconds = {"attack_s": t_attack, "corruptions_s": time.perf_counter() - t0 - t_attack}
    outcomes = {"clean": res.clean_correct.bool().cpu(), "robust": res.robust.bool().cpu(), "corruption": out,
                "seconds": seconds, "attack_settings": res.settings, "flags": [f.to_dict() for f in res.flags]}
    if certify:
        from robustest.evaluate.certification import certified_outcomes

        t1 = time.perf_counter()
        outcomes["certified"] = certified_outcomes(model, x, y, attack["eps"], attack["norm"], certify["method"])
        seconds["certify_s"] = time.perf_counter() - t1
    return outcomes


def _as_stored(x: torch.Tensor) -> torch.Tensor:
    """uint8 when every value is an exact multiple of 1/255 (lossless), else float32."""
    x = x.detach().cpu().float()
    q = torch.round(x * 255.0)
    if bool(torch.equal(q / 255.0, x)):
        return q.to(torch.uint8)
    return x.contiguous()


def build_suite(model: nn.Module, data: DataLike, eps: float, *, k: int = 100, norm: str = "linf",
                version: str = "standard", n_targets: int | None = None, corruptions: Any = None,
                severities: Any = (1, 2, 3, 4, 5), strata: int = 4, by_class: str = "auto",
                allocation: str = "proportional", n_neighbors: int = 20, noise_eps: float = 0.5,
                seed: int = 0, batch_size: int = 256, dataset: str | None = None, split: str | None = None,
                certify: str | None = None, progress: bool = False) -> Suite:
    """Build a regression suite of ``k`` samples of the labelled split ``data`` (images N x C x H x W in [0, 1],
    int64 labels) for the baseline ``model`` (see the module docstring).

    ``eps``/``norm``/``version`` (``"standard"``: AutoAttack's ensemble; ``"fast"``: APGD-CE + APGD-T on 3
    targets)/``n_targets``: the attack settings every check of the suite uses; ``corruptions`` (None, ``"all"``,
    a group or names) at ``severities``: the corruption settings (none by default). ``strata``: rank-quantile
    bins of the local robustness score (``n_neighbors`` neighbours with uniform noise of width ``noise_eps``),
    ``by_class``: "auto" | "yes" | "no" (cross the bins with the class), ``allocation``: "proportional" |
    "neyman". ``seed`` drives the analysis, the draw, the attacks and the corruptions. ``certify``: None, or
    ``"ibp"`` / ``"crown"``: also store which samples the baseline's certificate proves at ``eps`` (a model the
    bounds do not cover is refused before any work); every check then compares them. ``k >= n`` takes the whole
    split. Under torchrun every rank returns the same suite (the analysis and the evaluation are shared out).
    """
    from robustest import corruptions as corr_mod
    from robustest.core.validation import check_eps
    from robustest.evaluate import ensemble_plan
    from robustest.weakrobust import analyze

    t0 = time.perf_counter()
    if isinstance(k, bool) or not isinstance(k, int) or k < MIN_PER_STRATUM:
        raise ConfigError(f"k must be an integer >= {MIN_PER_STRATUM}, got {k!r}")
    if isinstance(strata, bool) or not isinstance(strata, int) or strata < 1:
        raise ConfigError(f"strata must be a positive integer, got {strata!r}")
    if allocation not in ALLOCATIONS:
        raise ConfigError(f"unknown allocation {allocation!r}: use one of {', '.join(ALLOCATIONS)}")
    if by_class not in BY_CLASS:
        raise ConfigError(f"by_class must be one of {', '.join(BY_CLASS)}, got {by_class!r}")
    if version not in ("standard", "fast"):
        raise ConfigError(f"version must be 'standard' or 'fast', got {version!r}")
    eps = float(check_eps("eps", eps, norm))
    ensemble_plan(version, norm, None, n_targets=n_targets)  # norm and n_targets checked before any work
    cert = None
    if certify is not None:
        from robustest.core.batching import image_shape
        from robustest.evaluate.certification import BRACKET_METHODS, check_method

        if certify not in BRACKET_METHODS:
            raise ConfigError(f"a suite stores bound-propagation certificates: certify must be one of "
                              f"{', '.join(BRACKET_METHODS)}, got {certify!r}")
        check_method(model, image_shape(data), certify, norm)
        cert = {"method": certify}
    settings: list[list[Any]] = []
    if corruptions is not None:
        names = corr_mod.resolve_names(corruptions)
        sevs = sorted({int(s) for s in severities})
        if not sevs or any(s not in (1, 2, 3, 4, 5) for s in sevs):
            raise ConfigError(f"severities must be values in 1-5, got {list(severities)!r}")
        settings = [[c, s] for c in names for s in sevs]
    n = num_samples(data)
    if n < MIN_PER_STRATUM:
        raise DataError(f"the split has {n} samples: a suite needs at least {MIN_PER_STRATUM}")
    k = min(k, n)
    an = analyze(model, data, n_neighbors=n_neighbors, eps=noise_eps, seed=seed, progress=progress)
    t_analyze = time.perf_counter() - t0
    pos, stratum_all, alloc, desc, crossed = stratified_draw(an, k, strata, by_class, allocation, seed)
    h = len(desc)
    sizes = torch.bincount(stratum_all, minlength=h)
    index = an.index[pos].long()
    x, y = take(data, index)
    if y is None:
        raise DataError("the split needs labels")
    x = x.float()
    y = y.long()
    attack = {"eps": eps, "norm": norm, "version": version, "n_targets": n_targets, "seed": int(seed),
              "batch_size": int(batch_size)}
    corruption = {"settings": settings, "seed": int(seed)}
    t1 = time.perf_counter()
    outcomes = evaluate_outcomes(model, x, y, attack, corruption, progress=progress, certify=cert)
    t_eval = time.perf_counter() - t1
    stratum = stratum_all[pos]
    from robustest import __version__

    baseline = {name: e.to_dict() for name, e in outcome_estimates(outcomes, stratum, sizes).items()}
    meta: dict[str, Any] = {
        "k": int(len(index)), "n_population": int(n), "dataset": dataset, "split": split,
        "data_sha256": data_sha256(data),
        "samples_sha256": hashlib.sha256(_as_stored(x).numpy().tobytes() + y.numpy().tobytes()).hexdigest(),
        "stratum_sizes": sizes.tolist(), "stratum_weights": (sizes.double() / n).tolist(),
        "stratum_samples": alloc.tolist(), "strata": {"bins": max(d["bin"] for d in desc) + 1, "by_class": crossed,
                                                      "requested": int(strata), "cells": desc,
                                                      "allocation": allocation},
        "analysis": {k_: an.params[k_] for k_ in ("n_neighbors", "eps", "noise", "quantize", "seed")},
        "attack": attack, "corruption": corruption,
        "baseline_sha256": model_fingerprint(model), "baseline": baseline, "baseline_flags": outcomes["flags"],
        "robustest_version": __version__, "format_version": SUITE_VERSION if cert is not None else 1,
    }
    if cert is not None:
        meta["certify"] = cert
    timings = {"analyze_s": t_analyze, "evaluate_s": t_eval, "total_s": time.perf_counter() - t0}
    return Suite(x=_as_stored(x), y=y, index=index, stratum=stratum.long(), score=an.score[pos].float(),
                 clean=outcomes["clean"], robust=outcomes["robust"], corruption=outcomes["corruption"], meta=meta,
                 timings=timings, certified=outcomes.get("certified"))


#: the command line of build_suite's options (``robustest suite build``; defaults: the signature's)
BUILD_OPTIONS = {
    "norm": spec("choice", "threat model", choices=("linf", "l2")),
    "version": spec("choice", "attack ensemble every check runs (standard = AutoAttack's; fast: APGD-CE + APGD-T on 3 "
                    "targets)", choices=("standard", "fast")),
    "n_targets": spec("positive-int", "target classes of APGD-T and FAB-T", metavar="K", shown="min(9, classes - 1)"),
    "corruptions": spec("text", "also store corruption outcomes: 'all', a group or names", metavar="LIST",
                        shown="none"),
    "certify": spec("choice", "also store which samples the baseline's certificate proves at --eps (bound "
                    "propagation); every check compares the candidate's", choices=("ibp", "crown"), shown="none"),
    "k": spec("positive-int", "samples in the suite", metavar="K"),
    "strata": spec("positive-int", "rank-quantile bins of the local robustness score (at most K/2)", metavar="H"),
    "by_class": spec("choice", "cross the score bins with the class (auto: when K gives every cell 2 samples)",
                     choices=BY_CLASS),
    "allocation": spec("choice", "samples per stratum: proportional to its size, or Neyman", choices=ALLOCATIONS),
    "n_neighbors": spec("positive-int", "noisy neighbours per sample of the local robustness analysis", metavar="Q",
                        flag="neighbors"),
    "noise_eps": spec("noise-width", "width of the analysis's uniform noise, pixel scale", metavar="W"),
    "batch_size": spec("positive-int", "images per attack batch", metavar="B"),
}
