"""The reports of ``suite build`` and ``suite check`` (OUT/report.html) and the per-stratum rows both record: the
strata, the stratified estimates with their intervals, the paired comparison with the baseline, the verdict, and
the samples whose outcome changed."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["build_report", "check_report", "stratum_rows"]


def stratum_rows(suite: Any, outcomes: dict[str, Any], base: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per stratum of ``suite``: its score bin and class, N_h, weight, samples, the share of them robust in
    ``outcomes`` (and in the baseline's ``base``) and their mean score."""
    rows = []
    cells = suite.meta["strata"]["cells"]
    for h, n_h in enumerate(suite.meta["stratum_sizes"]):
        m = suite.stratum == h
        row: dict[str, Any] = {"stratum": h, "score bin": cells[h]["bin"],
                               "class": "all" if cells[h]["class"] < 0 else cells[h]["class"], "N_h": n_h,
                               "weight": suite.meta["stratum_weights"][h], "samples": int(m.sum()),
                               "robust": float(outcomes["robust"][m].double().mean())}
        if base is not None:
            row["baseline robust"] = float(base["robust"][m].double().mean())
        row["mean score"] = float(suite.score[m].double().mean()) if bool(torch.any(m)) else None
        rows.append(row)
    return rows


#: number formats of the report's tables (robustest.report.column_formatter): shares as fractions, drops signed
_STRATUM_KINDS = {"weight": "fraction", "robust": "fraction", "baseline robust": "fraction"}
_ESTIMATE_KINDS = {"value": "fraction", "ci low": "fraction", "ci high": "fraction", "effective n": "number"}
_DROP_KINDS = {"drop": "signed", "ci low": "signed", "ci high": "signed"}
#: suite check's verdict -> the report's badge
_BADGE = {"pass": "pass", "regression": "fail", "unreliable": "fail", "no baseline": "not-gated"}


def build_report(suite: Any, doc: dict[str, Any]) -> Any:
    """The HTML report (:class:`robustest.report.HtmlReport`, written by the caller) of a built ``suite``: strata,
    the baseline's estimates and the samples; ``doc`` is the results document written."""
    from robustest import report

    m = suite.meta
    a = m["attack"]
    rep = report.HtmlReport.from_results(doc, f"robustest suite build: {m.get('dataset')}, {a['norm']} "
                                              f"eps={a['eps']:g}")
    r = m["baseline"]["robust_accuracy"]
    rep.paragraph(f"{m['k']} of the {m['n_population']} samples of the split, drawn in {len(m['stratum_sizes'])} "
                  f"strata (rank-quantile bins of the local robustness score under the baseline"
                  f"{', crossed with the class' if m['strata']['by_class'] else ''}; {m['strata']['allocation']} "
                  f"allocation). The baseline's stratified robust accuracy on them ({a['version']} ensemble): "
                  f"{100 * r['value']:.1f}%, 95% interval {100 * r['ci_low']:.1f}-{100 * r['ci_high']:.1f}%.")
    rep.verdict("not-gated", "Building a suite gates nothing: robustest suite check compares a candidate with this "
                             "baseline and gates on a regression.")
    rep.heading("Strata").table(stratum_rows(suite, {"robust": suite.robust}), kinds=_STRATUM_KINDS,
                                caption="N_h: samples of the split in the stratum; weight W_h = N_h / N; robust: "
                                        "share of the stratum's suite samples the baseline keeps robust.")
    rows = [{"estimate": k.replace("_", " "), "value": v["value"], "ci low": v["ci_low"], "ci high": v["ci_high"],
             "effective n": v["n_eff"]} for k, v in m["baseline"].items()]
    rep.heading("Baseline on the suite").table(rows, kinds=_ESTIMATE_KINDS)
    idx = torch.arange(min(32, len(suite)))
    rep.image(_sample_grid(suite, idx, ["R" if bool(suite.robust[i]) else "x" for i in idx.tolist()]),
              "suite samples: label, stratum, R = robust under the baseline, x = broken")
    return rep


def _sample_grid(suite: Any, idx: torch.Tensor, marks: list[str]) -> bytes:
    """PNG grid of the suite samples at ``idx`` (int64 [n]), each captioned "label s<stratum> <mark>"."""
    from robustest import report

    caps = [f"{int(suite.y[i])} s{int(suite.stratum[i])} {m}" for i, m in zip(idx.tolist(), marks)]
    return report.save_image_grid(suite.images()[idx], None, captions=caps, ncols=8)


def check_report(res: Any, doc: dict[str, Any], suite: Any) -> Any:
    """The HTML report of a suite check ``res`` (:class:`robustest.suite.SuiteCheck`) on ``suite``: the verdict, the
    estimates, the paired comparison, the strata and the changed samples; ``doc`` is the results document written."""
    from robustest import report

    s = doc["suite"]
    a = s["attack"]
    rep = report.HtmlReport.from_results(doc, f"robustest suite check: {res.verdict}")
    rep.heading("Verdict").verdict(_BADGE[res.verdict], res.message())
    rep.note(f"Regression means: the exact one-sided McNemar test of the discordant pairs is significant at alpha "
             f"{res.alpha:g} AND the stratified drop of robust accuracy exceeds max-drop {100 * res.max_drop:.1f} "
             f"points. Suite: {s['k']} of {s['n_population']} samples in {s['strata']} strata; {a['norm']} "
             f"eps={a['eps']:g}, {a['version']} ensemble.")
    rows = [{"model": "candidate", "estimate": "robust accuracy", "value": res.robust.value,
             "ci low": res.robust.ci_low, "ci high": res.robust.ci_high},
            {"model": "candidate", "estimate": "clean accuracy", "value": res.clean.value, "ci low": res.clean.ci_low,
             "ci high": res.clean.ci_high}]
    for name, e in (("corruption accuracy", res.corruption), ("certified accuracy", res.certified)):
        if e is not None:
            rows.append({"model": "candidate", "estimate": name, "value": e.value, "ci low": e.ci_low,
                         "ci high": e.ci_high})
    for k, v in (res.baseline or {}).items():
        rows.append({"model": f"baseline ({res.baseline_source})", "estimate": k.replace("_", " "), "value": v.value,
                     "ci low": v.ci_low, "ci high": v.ci_high})
    rep.heading("Stratified estimates (95% intervals)").table(rows, kinds=_ESTIMATE_KINDS)
    if res.comparison is not None:
        cmp_rows = []
        for name, c in (("robust accuracy", res.comparison), ("corruption accuracy", res.corruption_comparison),
                        ("certified accuracy", res.certified_comparison)):
            if c is None:
                continue
            cmp_rows.append({"measure": name, "drop": c.drop, "ci low": c.ci_low, "ci high": c.ci_high,
                             "only baseline right": c.b, "only candidate right": c.c,
                             "McNemar p (one-sided)": c.p_value if name != "corruption accuracy" else None})
        rep.heading("Baseline minus candidate, paired on the suite").table(cmp_rows, kinds=_DROP_KINDS)
    rep.heading("Per stratum").table(doc["strata"], kinds=_STRATUM_KINDS)
    _changed_samples(rep, res, suite)
    return rep


def _changed_samples(rep: Any, res: Any, suite: Any, limit: int = 32) -> None:
    """The samples whose robust outcome differs between baseline and candidate (those the candidate breaks
    first), or, without a baseline or without any change, the first suite samples with the candidate's outcome."""
    cand = res.outcomes["robust"].bool()
    base = None if res.baseline_outcomes is None else res.baseline_outcomes["robust"].bool()
    if base is not None and bool((cand != base).any()):
        broken = torch.nonzero(base & ~cand).flatten()
        saved = torch.nonzero(~base & cand).flatten()
        idx = torch.cat([broken, saved])[:limit]
        marks = ["broken" if bool(base[i]) else "saved" for i in idx.tolist()]
        what = (f"samples whose robust outcome changed ({len(broken)} broken by the candidate only, {len(saved)} "
                f"kept robust by the candidate only; first {len(idx)}): label, stratum, change")
    else:
        idx = torch.arange(min(limit, len(suite)))
        marks = ["R" if bool(cand[i]) else "x" for i in idx.tolist()]
        what = ("suite samples (no outcome differs from the baseline's)" if base is not None else "suite samples") + (
            ": label, stratum, R = robust under the candidate, x = broken")
    rep.heading("Samples").image(_sample_grid(suite, idx, marks), what)
