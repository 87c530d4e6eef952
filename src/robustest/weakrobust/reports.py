"""The reports of ``robustest analyze``, ``robustest validate`` and ``robustest enhance``: the local robustness of the
analysed samples (score histograms, the weakest samples), the adversarial radius, the weak set's errors per
perturbation type against the test split's, with strengths and weaknesses, and an enhancement before and after."""

from __future__ import annotations

from typing import Any

import torch

from robustest.core.batching import take
from robustest.report import HtmlReport, format_value, plural, save_hbars, save_image_grid
from robustest.weakrobust.analysis import Analysis
from robustest.weakrobust.enhance_pipeline import EnhanceRun
from robustest.weakrobust.validation import ValidationResult
from robustest.weakrobust.weakset import WeakSet

__all__ = ["analysis_report", "analyze_report", "enhance_report", "validation_report", "validation_rows",
           "weakest_grid", "weakest_rows"]


def weakest_grid(ds: Any, analysis: Analysis, positions: torch.Tensor, title: str) -> bytes:
    """A PNG grid of the samples of ``ds`` at the analysis positions ``positions`` (int64 [n]), captioned with label,
    top wrong class and score."""
    x = take(ds, analysis.index[positions])[0]
    caps = [f"y={int(analysis.label[p])} w={int(analysis.top_wrong[p])} s={float(analysis.score[p]):.2f}"
            for p in positions.tolist()]
    return save_image_grid(x, None, captions=caps, title=title)


def analysis_report(rep: HtmlReport, ds: Any, analysis: Analysis, top: int) -> None:
    """Add the local robustness section to ``rep``: the summary, the score histograms and the ``top`` weakest."""
    rep.heading("Local robustness")
    rep.key_values({k: v for k, v in analysis.summary().items() if k != "seconds"})
    rep.histogram({"mean misprediction score": analysis.score},
                  "distribution of the per-sample mean misprediction score over the neighbours", title="sample scores",
                  xlabel="mean misprediction score (higher = weaker)", log=True)
    rep.histogram({"fraction of neighbours misclassified": analysis.frac_misclassified},
                  "fraction of neighbours misclassified", title="fraction misclassified", xlabel="fraction", log=True)
    order = analysis.order()[:top]
    if len(order):
        rep.image(weakest_grid(ds, analysis, order, f"{len(order)} weakest samples"),
                  "Weakest samples: y = label, w = top wrong class (largest mean neighbour probability), s = score.")


def weakest_rows(analysis: Analysis, n: int = 20) -> list[dict]:
    """The ``n`` weakest samples of ``analysis``, one row each (index, label, score, neighbours misclassified)."""
    order = analysis.order()[:n]
    return [{"index": int(analysis.index[p]), "label": int(analysis.label[p]), "score": float(analysis.score[p]),
             "frac_misclassified": float(analysis.frac_misclassified[p]),
             "clean_correct": bool(analysis.clean_correct[p]), "top_wrong": int(analysis.top_wrong[p])}
            for p in order.tolist()]


def analyze_report(doc: dict[str, Any], ds: Any, analysis: Analysis, radius: torch.Tensor | None,
                   top: int) -> HtmlReport:
    """analyze's HtmlReport (to be written): the analysis of ``ds``, the adversarial radius [N] when measured, the
    weakest samples; ``doc`` is the results document written."""
    s = doc["settings"]
    rep = HtmlReport.from_results(doc, f"robustest analyze: {s['dataset']} {s['split']}")
    rep.paragraph(f"{len(analysis)} samples, {s['neighbors']} neighbours each, eps {format_value(s['eps'])} "
                  f"({s['noise']} noise{', quantised' if s['quantize'] else ''}).")
    analysis_report(rep, ds, analysis, top)
    if radius is not None:
        rep.heading("Adversarial radius")
        rep.key_values(doc["radius"])
        rep.histogram({"PGD radius": radius[torch.isfinite(radius)]}, "PGD radius", title="adversarial radius",
                      xlabel="smallest L-inf budget that flips the sample")
    rep.heading("Weakest samples")
    rep.table(doc["weakest"])
    return rep


def validation_rows(res: ValidationResult, test_res: ValidationResult | None) -> list[dict[str, Any]]:
    """One row per perturbation type: its family, its error on the set and on the test split, its label."""
    summary = res.summary()
    rows = []
    test_pt = test_res.per_type() if test_res else {}
    for t, d in summary["per_type"].items():
        rows.append({"type": t, "family": d["family"], "weak_error": d["error"],
                     "test_error": test_pt[t][1] if t in test_pt else None, "label": d["label"] or "-"})
    return rows


def validation_report(doc: dict[str, Any], dataset: str, split: str, ds: Any, analysis: Analysis, weak: WeakSet,
                      res: ValidationResult, test_res: ValidationResult | None,
                      rows: list[dict[str, Any]]) -> HtmlReport:
    """validate's HtmlReport (to be written): the set, the errors on it and on the test split per perturbation
    type (``rows``: :func:`validation_rows`), strengths and weaknesses, the analysis of ``ds``."""
    rep = HtmlReport.from_results(doc, f"robustest validate: {dataset}")
    how = {"weak": "the weakest", "weak-correct": "the weakest correctly classified",
           "stratified": f"stratified over {weak.rule.get('strata')} score strata, errors weighted by stratum share",
           "random": "uniformly at random"}[weak.rule["strategy"]]
    rep.paragraph(f"Validation set ({weak.rule['strategy']}): {len(weak)} of {len(analysis)} {split} samples, "
                  f"{how}. A perturbation type is a weakness when its error on the set exceeds the mean error of "
                  "its family (attacks vs attacks, corruptions vs corruptions), else a strength.")
    rep.table([{"set": "weak", "n": len(weak), "clean_error": res.clean_error, "mean_adv_error": res.mean_adv_error,
                "mce": res.mce}] + ([{"set": "test", "n": len(test_res), "clean_error": test_res.clean_error,
                                      "mean_adv_error": test_res.mean_adv_error, "mce": test_res.mce}]
                                    if test_res else []))
    bars = {"weak set": {r["type"]: r["weak_error"] for r in rows}}
    if test_res:
        bars["test split"] = {r["type"]: r["test_error"] for r in rows}
    rep.image(save_hbars(bars, None, title="error per perturbation type", xlabel="top-1 error"),
              "Error per perturbation type (mean over budgets / severities): weak set vs test split.")
    rep.heading("Strengths and weaknesses")
    rep.table(rows, ["type", "family", "weak_error", "test_error", "label"])
    analysis_report(rep, ds, analysis, 32)
    return rep


def enhance_report(doc: dict[str, Any], run: EnhanceRun, epochs: int) -> HtmlReport:
    """enhance's HtmlReport (to be written): the pool and weaknesses, the epochs, and the test figures before and
    after with the error per perturbation type; ``doc`` is the results document written."""
    before, after = run.before, run.after
    rep = HtmlReport.from_results(doc, "robustest enhance")
    rep.paragraph(f"{plural(epochs, 'epoch')}; pool: {', '.join(run.result.pool)}; "
                  f"weaknesses: {', '.join(run.weaknesses) or 'none'}.")
    rep.heading("Epochs")
    rep.table(run.result.epochs)
    if before and after:
        rep.heading("Before and after, on the test split")
        rep.table([{"model": "before", **{k: v for k, v in before.items() if k != "per_type"}},
                   {"model": "after", **{k: v for k, v in after.items() if k != "per_type"}}])
        rep.image(save_hbars({"before": before["per_type"], "after": after["per_type"]}, None,
                             title="test error per perturbation", xlabel="top-1 error"),
                  "Test error per perturbation type: held-out corruptions (not in the training pool) and white-box "
                  "attacks, before and after enhancement.")
    return rep
