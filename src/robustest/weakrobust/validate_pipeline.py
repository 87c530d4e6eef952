"""The validate pipeline: select a weak-robust validation set from an analysis, measure the model's errors on it
under attacks and corruptions, and on test samples for comparison (what ``robustest validate`` runs).

* :func:`check_analysis_of`: an analysis read from a file must analyse the samples being validated.
* :func:`validate_pipeline`: :func:`robustest.weakrobust.select_weak`, :func:`robustest.weakrobust.validate` on the
  set and on the first test samples; writes ``OUT/weakset.pt``, ``weakset.json`` and ``validation.pt``; returns a
  :class:`ValidateRun` whose :meth:`ValidateRun.to_results` is the validate verb's results.

Example::

    analysis = analyze(model, train)
    run = validate_pipeline(model, train, analysis, out="val", test=test, test_limit=500, select={"k": 100})
    write_results("val", "validate", settings, run.to_results(), {**run.timings, "total_s": seconds})

(``run.timings`` hold the parts; results.json also records the whole run's ``total_s``.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from robustest.core.atomic import check_writable
from robustest.core.batching import labels_of, num_samples, take
from robustest.core.devices import model_device
from robustest.core.errors import DataError
from robustest.core.memory import peak_rss_mib
from robustest.core.options import defaults_of
from robustest.weakrobust.analysis import Analysis
from robustest.weakrobust.reports import validation_rows
from robustest.weakrobust.validation import ValidationResult, validate
from robustest.weakrobust.weakset import WeakSet, select_weak

__all__ = ["ITERATIVE_ATTACKS", "ValidateRun", "check_analysis_of", "validate_pipeline"]

#: the attacks whose number of steps ``attack_steps`` sets
ITERATIVE_ATTACKS = ("pgd", "bim", "mifgsm", "rfgsm")
#: select_weak's defaults (the selection options the settings record when a caller leaves them out)
_SELECT_DEFAULTS = defaults_of(select_weak)


def check_analysis_of(analysis: Analysis, data: Any, what: str, data_name: str = "the data") -> Analysis:
    """``analysis`` when it analyses ``data`` (as many samples, the same labels); a one-line DataError naming
    ``what`` (the analysis file) and ``data_name`` otherwise."""
    labels, n = labels_of(data), num_samples(data)
    if len(analysis) != n or (labels is not None and not torch.equal(analysis.label, labels.long())):
        raise DataError(f"{what} analyses {len(analysis)} samples but {data_name} has {n} (or other labels): "
                        "use the same data set, split and --limit as 'robustest analyze'")
    return analysis


@dataclass
class ValidateRun:
    """What :func:`validate_pipeline` did: the ``weak`` set, the validation ``result`` on it and ``test_result`` on
    the test samples (or None), the comparison ``rows`` (one per perturbation), the number of samples analysed,
    ``timings``, the files written and the ``settings`` in effect (the set's rule, the perturbations measured, the
    test samples, seed and device; the analysis's own are its file's or options')."""

    weak: WeakSet
    result: ValidationResult
    test_result: ValidationResult | None
    rows: list[dict[str, Any]]
    n_analysed: int
    timings: dict[str, float]
    files: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def summary_line(self) -> str:
        """The validation in one line: the set's strategy and size, the mean adversarial error, the mCE and the
        weaknesses found (what the verb prints under its table)."""
        from robustest.report import format_value as fmt

        res = self.result
        return (f"{self.weak.rule['strategy']} set: {len(self.weak)} samples; mean adversarial error "
                f"{fmt(res.mean_adv_error, 'error')}, mCE {fmt(res.mce, 'mce')}; "
                f"weaknesses: {', '.join(res.weaknesses()) or 'none'}")

    def to_results(self) -> dict[str, Any]:
        """The results of the validate verb: the set, the validation on it and on the test samples, weaknesses and
        strengths, the table, peak memory and the files."""
        w, res = self.weak, self.result
        return {"n_analysed": self.n_analysed,
                "weak_set": {"n": len(w), "strategy": w.rule["strategy"], "rule": w.rule,
                             "indices": w.indices.tolist(), "weights": None if w.weights is None
                             else w.weights.tolist()},
                "validation": res.to_dict(), "test": self.test_result.to_dict() if self.test_result else None,
                "weaknesses": res.weaknesses(), "strengths": [t for t, v in res.labels().items() if v == "strength"],
                "table": self.rows, "peak_rss_mib": peak_rss_mib(), "files": self.files}


def validate_pipeline(model: nn.Module, data: Any, analysis: Analysis, *, out: str | Path, test: Any = None,
                      test_limit: int = 0, select: dict[str, Any] | None = None,
                      perturbations: list[str] | tuple[str, ...] = ("all",), eps: list[float] | None = None,
                      severities: tuple[int, ...] = (1, 2, 3, 4, 5), attack_steps: int | None = None, seed: int = 0,
                      progress: bool = True, analysis_s: float = 0.0) -> ValidateRun:
    """Select the weak set of ``data`` from its ``analysis`` (``select``: the options of
    :func:`robustest.weakrobust.select_weak`), save it in ``out`` (created if missing: ``weakset.pt``,
    ``weakset.json``), validate the model on it (``validation.pt``) and on the first ``test_limit`` samples of
    ``test`` under ``perturbations``
    (attack radii ``eps``, corruption ``severities``, ``attack_steps`` steps of the iterative attacks). Raises
    DataError when the set is empty. ``analysis_s``: the seconds the analysis took, recorded in the timings."""
    weak = select_weak(analysis, seed=seed, **(select or {}))
    if len(weak) == 0:
        raise DataError("the weak set is empty (no sample has that many neighbours misclassified): "
                        "use --k, --fraction or a lower --threshold")
    out = check_writable(out)
    weak.save(out / "weakset.pt")
    weak.save(out / "weakset.json")
    kw = {a: {"steps": attack_steps} for a in ITERATIVE_ATTACKS} if attack_steps else {}
    common = dict(perturbations=perturbations, eps=eps, severities=tuple(severities), attack_kwargs=kw, seed=seed,
                  progress=progress)
    t1 = time.perf_counter()
    res = validate(model, data, weak, **common)
    res.save(out / "validation.pt")
    t_weak = time.perf_counter() - t1
    t2 = time.perf_counter()
    test_res = None
    if test is not None and test_limit > 0:
        test_res = validate(model, take(test, torch.arange(min(test_limit, num_samples(test)))), None, **common)
    t_test = time.perf_counter() - t2
    files = {"weak_set": "weakset.pt", "weak_set_json": "weakset.json", "validation": "validation.pt",
             "report": "report.html"}
    return ValidateRun(weak, res, test_res, validation_rows(res, test_res), len(analysis),
                       {"analysis_s": analysis_s, "validate_weak_s": t_weak, "validate_test_s": t_test}, files,
                       _settings(weak, res, select or {}, attack_steps, test_limit, seed, model))


def _settings(weak: WeakSet, res: ValidationResult, select: dict[str, Any], attack_steps: int | None,
              test_limit: int, seed: int, model: nn.Module) -> dict[str, Any]:
    """The settings a validation ran with: the set's rule (``select`` over select_weak's defaults), the
    perturbations measured, the test samples."""
    sel = {**_SELECT_DEFAULTS, **select}
    strategy, meta = weak.rule["strategy"], res.meta
    settings: dict[str, Any] = {"strategy": strategy}
    if strategy == "stratified":
        settings.update(strata=sel["strata"], allocation=sel["allocation"])
    settings.update({key: weak.rule[key] for key in ("k", "fraction", "threshold") if key in weak.rule})
    settings.update(per_class=bool(sel["per_class"]), correct_only=strategy == "weak-correct",
                    perturbations=[*meta["attacks"], *meta["corruptions"]])
    if meta["attacks"]:
        settings["attack_eps"] = list(meta["eps"])
        if attack_steps:
            settings["attack_steps"] = attack_steps
    if meta["corruptions"]:
        settings["severities"] = list(meta["severities"])
    settings.update(test_limit=test_limit, seed=seed, device=str(model_device(model)))
    return settings
