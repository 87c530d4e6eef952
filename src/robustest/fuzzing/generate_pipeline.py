"""The generate pipeline: generate tests from seeds with an attack or a fuzzer, measure each test's FOL against its
seed, and write the tests file score and select read (what ``robustest generate`` runs).

:func:`generate_pipeline` runs :func:`robustest.fuzzing.generate.generate_tests` and
:func:`robustest.fuzzing.generate.measure_fol`, writes ``OUT/tests.pt`` (robustest.data.save_tests),
``examples.png`` and ``fol_hist.png`` (with any test) and ``summary.json``, and returns a :class:`GenerateRun`
whose :meth:`GenerateRun.to_results` is the generate verb's results.

Example::

    opts = GenerateOptions(method="pgd", steps=10)
    run = generate_pipeline(opts, model, test, out="gen", eps=0.3, source={"dataset": "digits", "split": "test"})
    write_results("gen", "generate", settings, run.to_results(), run.timings)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from robustest.core.atomic import atomic_write_json, check_writable
from robustest.core.batching import num_samples
from robustest.core.devices import model_device
from robustest.core.errors import ConfigError
from robustest.core.memory import peak_rss_mib
from robustest.fuzzing.generate import (
    FUZZERS,
    GeneratedTests,
    GenerateOptions,
    figures_of,
    generate_tests,
    measure_fol,
    save_examples,
)

__all__ = ["GenerateRun", "generate_pipeline", "settings_in_effect"]

#: the keys of summary.json that results.json does not repeat (its settings hold them)
_SETTINGS_KEYS = ("seed", "method", "dataset", "split", "checkpoint", "params", "files")


@dataclass
class GenerateRun:
    """What :func:`generate_pipeline` did: the ``tests``, their ``fol`` [T] against their seeds (at ``fol_eps`` in
    ``fol_norm``), the ``summary`` written to summary.json, the examples ``grid`` (PNG bytes, None without tests),
    the model's ``device``, ``timings`` and the ``settings`` in effect (:func:`settings_in_effect`)."""

    tests: GeneratedTests
    fol: torch.Tensor
    fol_norm: str
    fol_eps: float
    summary: dict[str, Any]
    grid: bytes | None
    device: str
    timings: dict[str, float]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tests(self) -> int:
        return int(self.tests.x.shape[0])

    def summary_line(self, seconds: float | None = None) -> str:
        """The generation in one line: the method, seeds, data set and split, tests made, the attack's success rate
        (when it has one) and ``seconds`` (default: the pipeline's total; what ``robustest generate`` prints)."""
        from robustest.report import format_value as fmt

        s = self.summary
        rate = "" if s.get("success_rate") is None else f", success rate {fmt(s['success_rate'], 'success_rate')}"
        return (f"{s['method']} on {s['seeds']} {s['dataset']}/{s['split']} seeds: {self.num_tests} tests{rate} "
                f"({fmt(self.timings['total_s'] if seconds is None else seconds, 'total_s')} s)")

    def to_results(self) -> dict[str, Any]:
        """The results of the generate verb: the summary's figures, the device and the files written."""
        results = {k: v for k, v in self.summary.items() if k not in _SETTINGS_KEYS}
        results["device"] = self.device
        results["files"] = {"tests": "tests.pt", "report": "report.html", "summary": "summary.json",
                            **({"examples": "examples.png", "histogram": "fol_hist.png"} if self.num_tests else {})}
        return results


def generate_pipeline(opts: GenerateOptions, model: nn.Module, seeds: Any, *, out: str | Path, eps: float,
                      fol_norm: str | None = None, source: dict[str, Any] | None = None, profile: Any = None,
                      grid: int = 8, seed: int = 0, progress: bool = True, load_s: float = 0.0) -> GenerateRun:
    """Generate the tests of ``opts.method`` from every image of the labelled ``seeds`` at radius ``eps`` (cov-fuzz:
    its coverage profile from ``profile``), measure their FOL in ``fol_norm`` (default ``opts.norm``) and write the
    tests file, ``grid`` examples and summary.json into the folder ``out`` (created if missing). ``source``: the
    dataset, split and checkpoint names recorded with the tests; ``load_s``: seconds spent before, counted into the
    total. Raises
    ConfigError for no seeds, or ``keep_all`` with a fuzzer (which returns only failing tests)."""
    from robustest.data import save_tests

    t0 = time.perf_counter() - load_s
    n_seeds = num_samples(seeds)
    src = dict(source or {})
    if n_seeds == 0:
        raise ConfigError(f"the {src.get('split')} split of {src.get('dataset')} is empty: check "
                          "--dataset/--split/--limit")
    if opts.keep_all and opts.method in FUZZERS:
        raise ConfigError(f"--keep-all applies to attacks; {opts.method} only returns failing tests")
    fol_norm, out = fol_norm or opts.norm, check_writable(out)
    summary: dict[str, Any] = {"method": opts.method, "dataset": src.get("dataset"), "split": src.get("split"),
                               "checkpoint": src.get("checkpoint"), "seeds": n_seeds}
    t_gen = time.perf_counter()
    t = generate_tests(opts, model, seeds, n_seeds, eps, fol_norm, progress, profile)
    summary.update(t.summary)
    t_gen = time.perf_counter() - t_gen
    t_fol = time.perf_counter()
    fol_eps, fol_values = measure_fol(opts, model, t, eps, fol_norm)
    t_fol = time.perf_counter() - t_fol
    t.extra.update({"dataset": src.get("dataset"), "split": src.get("split"), "fol_norm": fol_norm,
                    "fol_eps": fol_eps, "eps": eps if opts.method != "cw" else opts.eps,
                    "params": summary.get("params", {})})
    save_tests(out / "tests.pt", t.x, t.y, t.index, opts.method, fol=fol_values, extra=t.extra)
    summary.update({**figures_of(t, fol_values, fol_norm, fol_eps), "peak_rss_mib": peak_rss_mib(), "seed": seed,
                    "files": ["tests.pt", "summary.json", "results.json", "report.html"]})
    png = None
    if int(t.x.shape[0]):
        png = save_examples(out, grid, opts.method, t, fol_values, fol_norm)
        summary["files"] += ["examples.png", "fol_hist.png"]
    timings = {"generate_s": t_gen, "fol_s": t_fol, "total_s": time.perf_counter() - t0}
    atomic_write_json(out / "summary.json", {**summary, "timings": timings})
    device = str(model_device(model))
    settings = settings_in_effect(opts, summary.get("params", {}), fol_norm, fol_eps, grid=grid, seed=seed,
                                  device=device)
    return GenerateRun(t, fol_values, fol_norm, fol_eps, summary, png, device, timings, settings)


def settings_in_effect(opts: GenerateOptions, params: dict[str, Any], fol_norm: str, fol_eps: float, *, grid: int,
                       seed: int, device: str) -> dict[str, Any]:
    """The settings a generation ran with, as results.json records them: the method, the ``params`` it resolved
    (an attack's keyword arguments, a fuzzer's options; cov-fuzz's metric options and profile limit), whether an
    attack kept every image, the FOL's norm and radius, the batch size, ``grid``, ``seed`` and ``device``."""
    m = opts.method
    d: dict[str, Any] = {"method": m, **{k: v for k, v in params.items() if v is not None and k != "metric_opts"}}
    if m == "cov-fuzz":
        d.update(params.get("metric_opts") or {})
        d.pop("profile_images", None)
        if opts.profile_limit is not None:
            d["profile_limit"] = opts.profile_limit
    if m == "fol-fuzz" and opts.fuzz_eps is not None:
        d["fuzz_eps"] = d.pop("eps", opts.fuzz_eps)
    if m not in FUZZERS:
        d["keep_all"] = bool(opts.keep_all)
    d.update(fol_norm=fol_norm, fol_eps=fol_eps, batch_size=opts.batch_size, grid=grid, seed=seed, device=device)
    return d
