"""The reports of ``robustest score`` (the distribution of one metric's scores) and ``robustest select`` (the pool's
scores against the selection's)."""

from __future__ import annotations

from typing import Any

import torch

from robustest.report import HtmlReport

__all__ = ["score_report", "select_report"]


def score_report(doc: dict[str, Any], scores: torch.Tensor) -> HtmlReport:
    """report.html of a scoring run: summary, quantiles, histogram."""
    rep = HtmlReport.from_results(doc, f"robustest score: {doc['metric']} on {doc['source']}")
    rep.paragraph(doc["description"])
    summary = {k: doc.get(k) for k in ("count", "mean", "std", "min", "max", "non_finite", "set_coverage",
                                       "num_cells") if k in doc}
    rep.key_values(summary)
    if doc.get("quantiles"):
        rep.heading("Quantiles")
        rep.table([doc["quantiles"]])
    finite = scores[torch.isfinite(scores)]
    rep.histogram(finite, f"distribution of the {doc['metric']} scores", title=f"{doc['metric']} (n={len(finite)})",
                  xlabel=doc["metric"])
    if doc.get("options"):
        rep.heading("Metric options")
        rep.key_values(doc["options"])
    return rep


def select_report(doc: dict[str, Any], scores: torch.Tensor, chosen: torch.Tensor) -> HtmlReport:
    """report.html of a selection: statistics of the pool and of the selection, and their score histograms."""
    strategy = doc["settings"]["strategy"]
    rep = HtmlReport.from_results(doc, f"robustest select: {strategy}, {doc['selected']} of {doc['pool_size']}")
    rep.paragraph(doc["description"])
    for w in doc["warnings"]:
        rep.note(f"warning: {w}")
    rows = [{"set": "pool", **doc["pool_scores"]}, {"set": "selected", **doc["selected_scores"]}]
    rep.table(rows, ["set", "count", "mean", "median", "min", "max"], caption=f"scores ({doc['metric'] or 'score'})")
    if "cells" in doc:
        rep.key_values({k: doc[k] for k in ("cells", "cells_covered_by_pool", "cells_covered_by_selection")})
    s = scores.double()
    rep.histogram({"pool": s[torch.isfinite(s)], "selected": chosen},
                  "where the selected inputs lie in the pool's score distribution", bins=40,
                  title="scores of the pool and of the selection", xlabel=doc["metric"] or "score")
    return rep
