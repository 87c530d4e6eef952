"""The score pipeline: score every input with one test metric and write the scores file select reads (what
``robustest score`` runs).

* :class:`ScoreOptions`: the metric options a score runs with (they carry their flags): checked against the metric,
  handed to it, recorded.
* :func:`inputs_of_tests`: the inputs of a tests file from ``robustest generate`` (``tests.pt``), with FOL's seeds
  ``x0 = SEEDS[x0_index]`` read from the data set the tests were generated from, checked against what the file
  records.
* :func:`score_pipeline`: :func:`robustest.metrics.scoring.score`, then ``OUT/scores.pt`` (plain tensors: scores,
  index, labels, x0_index, coverage bits, metric and options), ``scores.csv``, ``scores_hist.png`` and
  ``summary.json``; returns a :class:`ScoreRun` whose :meth:`ScoreRun.to_results` is the score verb's results.

Example::

    inputs = ScoreInputs(test, source="digits:test")
    run = score_pipeline(model, inputs, "fol", out="scores", options={"eps": 0.3}, model_source="model.pt")
    doc = write_results("scores", "score", settings, run.to_results(), run.timings)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from robustest.core.atomic import atomic_save, atomic_write_json, check_writable
from robustest.core.batching import image_shape, take
from robustest.core.devices import model_device
from robustest.core.errors import ConfigError, DataError
from robustest.core.memory import peak_rss_mib
from robustest.core.options import option
from robustest.core.validation import check_eps
from robustest.metrics.scoring import AMP_METRICS, ScoreResult
from robustest.selection.scores_file import summarize, write_scores_csv

__all__ = ["SCORE_FILES", "ScoreInputs", "ScoreOptions", "ScoreRun", "score_pipeline", "inputs_of_tests"]

#: the files the pipeline writes (and the verb's report), by role
SCORE_FILES = {"scores": "scores.pt", "csv": "scores.csv", "histogram": "scores_hist.png", "summary": "summary.json",
               "report": "report.html"}


#: the options only some metrics take (each metric's registry entry names those it takes)
METRIC_OPTIONS = ("k", "threshold", "top_k", "scale")


@dataclass(frozen=True)
class ScoreOptions:
    """The options of a score beside the metric's name: FOL's ball (``eps``, ``norm``) and the loss metrics'
    ``label`` ("true": the data's, "pred": the model's prediction on the seed), ``amp`` autocast of the metrics
    computed from the logits alone, and the coverage metrics' ``k``, ``threshold``, ``top_k``, ``scale`` (None: the
    metric's default). The fields carry their flags (``robustest score``)."""

    eps: float = option(0.3, "radius", "FOL ball radius in pixel scale, a number or a fraction like 8/255 (L-inf: "
                        "in (0, 1])")
    norm: str = option("linf", "choice", "FOL perturbation norm; the gradient is measured in its dual",
                       choices=("linf", "l2", "l1"))
    label: str = option("true", "choice", "labels for the loss: the data's ('true') or the model's prediction on the "
                        "seed ('pred')", choices=("true", "pred"))
    amp: str | None = option(None, "choice", "run the forward passes of zol, gini, entropy, margin and max_prob in "
                             "bf16 (CPU or CUDA) or fp16 (CUDA) autocast: faster on GPUs, scores rounded accordingly",
                             choices=("bf16", "fp16"), shown="float32; the other metrics refuse it")
    k: int | None = option(None, "positive-int", "kmnc sections per neuron", shown="10")
    threshold: float | None = option(None, "number", "nc activation threshold", shown="0.5")
    top_k: int | None = option(None, "positive-int", "tknc neurons per layer", shown="1")
    scale: float | None = option(None, "non-negative", "nbc/snac margin in training std", shown="0")

    def check(self, metric: str) -> None:
        """Refuse what ``metric`` would silently ignore (an option it does not take, ``amp`` where it needs float32
        gradients or activations) and an ``eps`` outside ``norm``'s range: a one-line ConfigError naming the flag."""
        from robustest import metrics

        info = metrics.info(metric)
        bad = [f"--{o.replace('_', '-')}" for o in METRIC_OPTIONS
               if getattr(self, o) is not None and o not in info.options]
        if bad:
            raise ConfigError(f"{', '.join(bad)} does not apply to --metric {metric}: drop it")
        check_eps("eps", self.eps, self.norm)
        if self.amp is not None and metric not in AMP_METRICS:
            why = "input gradients" if info.kind == "loss" else "layer activations compared with a float32 reference"
            raise ConfigError(f"--amp applies to {', '.join(AMP_METRICS)} (computed from the logits alone); --metric "
                              f"{metric} needs {why} in float32: drop --amp")

    def of_metric(self, metric: str) -> dict[str, Any]:
        """The options ``metric`` takes (its registry entry's), those set: the keyword arguments of its scoring."""
        from robustest import metrics

        return {o: getattr(self, o) for o in metrics.info(metric).options if getattr(self, o) is not None}

    def settings(self, metric: str) -> dict[str, Any]:
        """The options in effect for ``metric``, as results.json records them (after the batch size): ``amp`` when
        set, FOL's ``eps`` and ``norm``, the loss metrics' ``label``."""
        d: dict[str, Any] = {} if self.amp is None else {"amp": self.amp}
        if metric == "fol":
            d.update(eps=self.eps, norm=self.norm)
        if metric in ("fol", "zol", "fol_gradnorm"):
            d["label"] = self.label
        return d


@dataclass(frozen=True)
class ScoreInputs:
    """What is scored: ``data`` (a data set or an (x, y) pair of N inputs), FOL's seeds ``x0`` (a function of the
    data-set positions of a batch, or None: each input is its own seed), the tests' ``x0_index`` [N] (tests files;
    recorded in the scores file) and ``source`` (``dataset:split`` or ``tests:PATH``, for the figures)."""

    data: Any
    source: str
    x0: Callable[[torch.Tensor], torch.Tensor] | None = None
    x0_index: torch.Tensor | None = None


def inputs_of_tests(path: str, *, limit: int | None = None, seeds_dataset: str | None = None,
                 seeds_root: str | None = None, seeds_split: str | None = None, workers: int = 0) -> ScoreInputs:
    """The first ``limit`` tests of the tests file ``path``; with ``seeds_dataset`` their seeds are that data set's
    images at ``x0_index`` (split ``seeds_split``, default the split the file records). Raises ConfigError when the
    file records another source data set or no split, DataError when the seeds do not match the tests (an index
    past the end, another image shape)."""
    from robustest import data as datasets

    t = datasets.load_tests(path)
    x, y, x0_index = t["x"].float(), t["y"].long(), t["x0_index"].long()
    if limit is not None:
        x, y, x0_index = x[:limit], y[:limit], x0_index[:limit]
    x0 = None
    if seeds_dataset is not None:
        extra = t.get("extra") or {}
        recorded = extra.get("dataset")
        if isinstance(recorded, str) and recorded.strip().lower() != seeds_dataset.strip().lower():
            raise ConfigError(f"the tests were generated from {recorded!r}, not {seeds_dataset!r}: "
                              f"pass --seeds-dataset {recorded}")
        split = seeds_split or extra.get("split")
        if split not in datasets.SPLITS:
            raise ConfigError("the tests file does not record its seeds' split: pass --seeds-split train|test")
        seeds = datasets.load(seeds_dataset, root=seeds_root, split=split, workers=workers)
        if len(x0_index) and int(x0_index.max()) >= len(seeds):
            raise DataError(f"x0_index of the tests reaches {int(x0_index.max())} but {seeds_dataset}:{split} "
                            f"has {len(seeds)} images: pass the data set the tests were generated from")
        if tuple(image_shape(seeds)) != tuple(x.shape[1:]):
            raise DataError(f"seed images have shape {tuple(image_shape(seeds))} but the tests {tuple(x.shape[1:])}: "
                            "pass the data set the tests were generated from")

        def x0(idx: torch.Tensor) -> torch.Tensor:
            return take(seeds, x0_index[idx.cpu()])[0]
    return ScoreInputs((x, y), f"tests:{path}", x0, x0_index)


@dataclass
class ScoreRun:
    """What :func:`score_pipeline` did: the metric's :class:`ScoreResult`, the ``figures`` of results.json,
    ``timings`` and ``own_seed``: whether FOL measured tests against themselves (a tests file scored without its
    seeds). The files it wrote are :data:`SCORE_FILES`."""

    metric: str
    result: ScoreResult
    figures: dict[str, Any]
    timings: dict[str, float]
    own_seed: bool = False

    def summary_lines(self) -> list[str]:
        """The figures the verb prints: the metric, inputs, mean, median, min, max and scoring seconds, and for a
        coverage metric the set's coverage of its cells."""
        from robustest.report import format_value as fmt

        s = self.figures
        lines = [f"{self.metric} on {len(self.result.scores)} inputs from {s['source']}: mean {fmt(s.get('mean'))}, "
                 f"median {fmt(s.get('quantiles', {}).get('q50'))}, min {fmt(s.get('min'))}, max {fmt(s.get('max'))} "
                 f"({fmt(self.timings['score_s'], 'score_s')} s)"]
        if "set_coverage" in s:
            lines.append(f"set coverage: {fmt(s['set_coverage'], 'coverage')} of {s['num_cells']} cells")
        return lines

    def to_results(self) -> dict[str, Any]:
        """The ``results`` of the score verb's results.json: the figures and the files."""
        return {**self.figures, "files": dict(SCORE_FILES)}


def score_pipeline(model: nn.Module, inputs: ScoreInputs, metric: str, *, out: str | Path, train: Any = None,
                   layers: list[str] | None = None, batch_size: int = 256, amp: str | None = None,
                   progress: bool = True, options: dict[str, Any] | None = None, model_source: str = "",
                   load_s: float = 0.0) -> ScoreRun:
    """Score ``inputs`` with ``metric`` (``options`` go to it; ``train``: the reference of coverage and surprise
    metrics) and write the scores file, its CSV, histogram and ``summary.json`` (the figures with
    ``checkpoint`` = ``model_source`` and the timings) into the folder ``out`` (created if missing). ``load_s``: the
    seconds spent loading before, counted into the timings' total."""
    from robustest import metrics
    from robustest.metrics.scoring import score
    from robustest.report import save_histogram

    out = check_writable(out)
    t1 = time.perf_counter()
    res = score(model, inputs.data, metric, train=train, x0=inputs.x0, layers=layers, batch_size=batch_size,
                progress=progress, amp=amp, **(options or {}))
    t_score = time.perf_counter() - t1
    scores, index, y = res.scores, res.index, res.labels
    n = len(scores)
    payload: dict[str, Any] = {"metric": metric, "scores": scores, "index": index, "labels": y,
                               "options": dict(res.options)}
    if res.bits is not None:
        payload["bits"] = res.bits
    x0_index = inputs.x0_index[index] if inputs.x0_index is not None else None
    if x0_index is not None:
        payload["x0_index"] = x0_index
    atomic_save(payload, out / SCORE_FILES["scores"])
    write_scores_csv(out / SCORE_FILES["csv"], index, scores, y, x0_index)
    save_histogram(scores, out / SCORE_FILES["histogram"], title=f"{metric} on {inputs.source} (n={n})",
                   xlabel=metric)
    coverage = {"set_coverage": res.set_coverage, "num_cells": res.num_cells, "layers": res.layers} \
        if res.set_coverage is not None else {}
    figures: dict[str, Any] = {
        "metric": metric, "description": metrics.describe(metric), "source": inputs.source, "options": res.options,
        **({"fol_seed": "x0 = seeds at x0_index" if inputs.x0 is not None else "x0 = x' (own seed)"}
           if metric == "fol" else {}),
        **summarize(scores[torch.isfinite(scores)]), "non_finite": int((~torch.isfinite(scores)).sum()), **coverage,
        "peak_rss_mib": peak_rss_mib(), "device": str(model_device(model))}
    timings = {"load_s": load_s, "score_s": t_score, "per_input_ms": 1000 * t_score / max(n, 1),
               "total_s": load_s + time.perf_counter() - t1}
    atomic_write_json(out / SCORE_FILES["summary"], {**figures, "checkpoint": model_source,
                                                     "fol_seed": figures.get("fol_seed"), "timings": timings})
    own_seed = metric == "fol" and inputs.x0_index is not None and inputs.x0 is None
    return ScoreRun(metric, res, figures, timings, own_seed)
