"""The analyze pipeline: the local robustness analysis of every sample of a split, in saved steps a rerun continues
from, and optionally each sample's adversarial radius (what ``robustest analyze`` runs; ``robustest validate``
computes its analysis the same way).

* :func:`resumable_analysis`: :func:`robustest.weakrobust.analyze` over spans of ``save_every x world size``
  samples, each saved atomically under ``OUT/state`` (a rerun of the same settings, model and data reuses them).
* :func:`analyze_pipeline`: that analysis saved as ``OUT/analysis.pt``, with ``radius_eps_max`` the smallest PGD
  radius flipping each sample (``OUT/radius.pt``) and its rank correlation with the score; returns an
  :class:`AnalyzeRun` whose :meth:`AnalyzeRun.to_results` is the analyze verb's results.

Example::

    run = analyze_pipeline(model, train, out="an", options=AnalysisOptions(neighbors=50, eps=0.22))
    write_results("an", "analyze", settings, run.to_results(), {**run.timings, "total_s": seconds})

(``run.timings`` hold the parts; results.json also records the whole run's ``total_s``.)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from robustest.core import distributed
from robustest.core.atomic import atomic_save, check_writable
from robustest.core.batching import num_samples
from robustest.core.memory import peak_rss_mib
from robustest.core.options import option
from robustest.core.steps import Steps, data_fingerprint, fingerprint
from robustest.weakrobust.analysis import Analysis, adversarial_radius, analyze

__all__ = ["ANALYSIS_STEP", "AnalysisOptions", "AnalyzeRun", "analyze_pipeline", "resumable_analysis"]

ANALYSIS_STEP = 16384  # samples per saved step of an analysis (a multiple of the noise block)


def _note(msg: str) -> None:
    print(f"note: {msg}", file=sys.stderr)


@dataclass(frozen=True)
class AnalysisOptions:
    """The options of :func:`robustest.weakrobust.analyze` an analysis runs with: ``neighbors`` noisy neighbours
    of noise width ``eps`` (``noise``: uniform or gaussian; ``no_quantize``: not rounded to the 256 levels),
    ``batch_size`` images per forward pass (None: the default), ``amp`` autocast, ``seed``; ``save_every``
    samples per process between two saves. The fields carry their flags (``robustest analyze`` and ``validate``)."""

    neighbors: int = option(50, "positive-int", "noisy neighbours per sample")
    eps: float = option(0.22, "noise-width", "width of the neighbours' noise, not an attack radius: delta ~ "
                        "U[-W/2, W/2] per pixel; --eps is the same option, the name of the reference code",
                        flag="noise-width", aliases=("eps",), metavar="W")
    noise: str = option("uniform", "choice", "noise law", choices=("uniform", "gaussian"))
    no_quantize: bool = option(False, "flag", "do not round neighbours to the 256 uint8 levels")
    batch_size: int | None = option(None, "batch-size", "images per forward pass, or 'auto': the largest that fits "
                                    "the GPU (on the CPU the default: about 4 million pixel values' worth: 5349 "
                                    "images of 28x28, 341 of 3x64x64)", metavar="B")
    amp: str | None = option(None, "choice", "run the analysis's forward passes in bf16 (CPU or CUDA) or fp16 "
                             "(CUDA) autocast: faster on GPUs, scores rounded accordingly", choices=("bf16", "fp16"),
                             shown="float32")
    seed: int = 0
    save_every: int = option(ANALYSIS_STEP, "positive-int", "save the analysis every N samples per process (under "
                             "torchrun a step covers N x ranks samples); rerunning the same command after a kill "
                             "continues from there", metavar="N")

    def settings(self, batch_size_auto: bool = False) -> dict[str, Any]:
        """The options as results.json records them (``batch_size_auto``: the batch size was probed)."""
        d: dict[str, Any] = {"neighbors": self.neighbors, "eps": self.eps, "noise": self.noise,
                             "quantize": not self.no_quantize}
        if self.batch_size is not None:
            d["batch_size"] = self.batch_size
        if batch_size_auto:
            d["batch_size_auto"] = True
        if self.amp is not None:
            d["amp"] = self.amp
        return d


def resumable_analysis(model: nn.Module, data: Any, out: str | Path, options: AnalysisOptions, *,
                       progress: bool = True, note: Callable[[str], None] = _note) -> Analysis:
    """The local robustness analysis of ``data`` in saved steps of ``options.save_every`` samples per process:
    rerunning it after a kill continues from the last finished step.

    Under torchrun a step covers ``save_every x world_size`` samples, so each rank does as much work between two
    saves (one gather, one atomic write) as a single process does; the scores do not depend on the step size
    (neighbour noise is seeded per block of samples), only the resume points do. ``note`` says when finished steps
    of an interrupted run are reused."""
    from robustest.models.checkpoints import state_fingerprint

    o = options
    every = o.save_every * distributed.world_size()
    settings = {k: getattr(o, k) for k in ("neighbors", "eps", "noise", "no_quantize", "seed", "amp")}
    settings["step"] = every
    steps = Steps(out, fingerprint("analyze", settings, state_fingerprint(model), data_fingerprint(data)), log=note)
    n, parts = num_samples(data), []
    for k, lo in enumerate(range(0, n, every)):
        span = (lo, min(lo + every, n))
        d = steps.run(f"analysis_{k:05d}", lambda span=span: analyze(
            model, data, n_neighbors=o.neighbors, eps=o.eps, noise=o.noise, quantize=not o.no_quantize,
            batch_size=o.batch_size, seed=o.seed, progress=progress, span=span, amp=o.amp).to_dict())
        parts.append(Analysis.from_dict(d, f"{out}/state/steps/analysis_{k:05d}.pt"))
    if steps.resumed:
        note(f"{steps.resumed} finished step(s) of an interrupted run reused")
    return Analysis.concat(parts)


@dataclass
class AnalyzeRun:
    """What :func:`analyze_pipeline` did: the ``analysis``, the adversarial ``radius`` per sample (or None) and its
    figures, ``timings`` and the files written."""

    analysis: Analysis
    radius: torch.Tensor | None
    radius_figures: dict[str, Any] | None
    timings: dict[str, float]
    files: dict[str, str] = field(default_factory=dict)

    def summary_line(self) -> str:
        """The analysis in one line: samples, seconds, clean accuracy, mean score and the share of samples with most
        neighbours misclassified (what the verb prints)."""
        from robustest.report import format_value as fmt

        a = self.analysis
        s = a.summary()
        return (f"analysed {len(a)} samples in {fmt(a.params['seconds'], 'analyze_s')} s: clean accuracy "
                f"{fmt(s['clean_accuracy'], 'accuracy')}, mean score {fmt(s['mean_score'])}, "
                f"{fmt(100 * s['frac_most_neighbours_wrong'])} % with most neighbours misclassified")

    def to_results(self) -> dict[str, Any]:
        """The results of the analyze verb: size, summary, the weakest samples, the radius figures, files, memory."""
        from robustest.weakrobust.reports import weakest_rows

        a = self.analysis
        return {"n": len(a), "summary": a.summary(), "weakest": weakest_rows(a), "files": self.files,
                **({"radius": self.radius_figures} if self.radius_figures is not None else {}),
                "peak_rss_mib": peak_rss_mib()}


def analyze_pipeline(model: nn.Module, data: Any, *, out: str | Path, options: AnalysisOptions,
                     radius_eps_max: float | None = None, progress: bool = True) -> AnalyzeRun:
    """Analyse ``data`` (:func:`resumable_analysis`) and save ``out/analysis.pt`` (the folder created if missing);
    with ``radius_eps_max`` also each sample's smallest flipping PGD L-inf radius up to it (``out/radius.pt``; inf:
    not flipped), its median and the Spearman correlation of the score with minus the radius (capped at twice
    ``radius_eps_max``)."""
    from scipy.stats import spearmanr


    out = check_writable(out)
    analysis = resumable_analysis(model, data, out, options, progress=progress)
    analysis.save(out / "analysis.pt")
    files = {"analysis": "analysis.pt", "report": "report.html"}
    timings = {"analyze_s": analysis.params["seconds"]}
    radius = figures = None
    if radius_eps_max:
        tr = time.perf_counter()
        radius = adversarial_radius(model, data, eps_max=radius_eps_max, seed=options.seed)
        timings["radius_s"] = time.perf_counter() - tr
        atomic_save(radius, out / "radius.pt")
        fin = radius[torch.isfinite(radius)]
        rho = spearmanr(analysis.score.numpy(), (-radius.clamp(max=2 * radius_eps_max)).numpy()).statistic
        figures = {"eps_max": radius_eps_max, "median": float(fin.median()) if fin.numel() else None,
                   "frac_not_flipped": float((~torch.isfinite(radius)).float().mean()),
                   "spearman_score_vs_minus_radius": None if rho != rho else float(rho)}
        files["radius"] = "radius.pt"
    return AnalyzeRun(analysis, radius, figures, timings, files)
