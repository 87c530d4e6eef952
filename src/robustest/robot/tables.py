"""The console tables of a RobOT run and of a strategy comparison, as rows and columns (the CLI prints them).

* :func:`loop_table`: one row per round (round 0 is the model before any round): clean, fixed-set, white-box (and
  AutoAttack) accuracy and the median FOL of the convergence rule.
* :func:`compare_table`: one row per (strategy, budget): each figure before and after (mean ± std over seeds),
  and the compute in thousands of passes when recorded.
* :func:`paired_table`: the paired differences to random selection, ``mean [low, high]`` per metric, marked ``*``
  where the interval excludes 0, and the verdict of :func:`robustest.robot.report.paired_verdict`.

Each returns ``(rows, columns)``: rows are dicts keyed by the column names, whose values are figures or text.
"""

from __future__ import annotations

from typing import Any

from robustest.report import format_value, mean_std
from robustest.robot.report import paired_verdict

__all__ = ["PAIRED_LABELS", "compare_table", "loop_table", "paired_cell", "paired_table"]

Table = tuple[list[dict[str, Any]], list[str]]

#: column titles of the paired differences, by metric
PAIRED_LABELS = {"fixed_set_accuracy": "fixed-set vs random", "whitebox_accuracy": "white-box vs random",
                 "autoattack_accuracy": "AutoAttack vs random", "clean_accuracy": "clean vs random"}


def _figures(rob: dict[str, Any]) -> dict[str, Any]:
    return {"clean accuracy": rob.get("clean_accuracy"), "fixed-set accuracy": rob.get("fixed_set_accuracy"),
            "white-box accuracy": rob.get("whitebox_accuracy"), "AutoAttack accuracy": rob.get("autoattack_accuracy")}


def loop_table(results: dict[str, Any]) -> Table:
    """The rounds of a loop's ``results`` (robustest.robot.run): the AutoAttack column only when it was measured."""
    rows = [{"round": 0, "selected": 0, **_figures(results["baseline"]),
             "median FOL": results["convergence_rule"]["round0"]["fol"]["median"]}]
    for rec in results["rounds"]:
        rows.append({"round": rec["round"], "selected": rec["selected"]["n"], **_figures(rec["robustness"]),
                     "median FOL": rec["convergence"]["statistic"]})
    cols = ["round", "selected", "clean accuracy", "fixed-set accuracy", "white-box accuracy"]
    if results["baseline"].get("autoattack_accuracy") is not None:
        cols.append("AutoAttack accuracy")
    return rows, [*cols, "median FOL"]


def compare_table(results: dict[str, Any]) -> Table:
    """The strategies of a comparison's ``results`` (robustest.robot.compare): before and after per figure, the
    AutoAttack columns only when measured, ``passes (k)`` only when some row records its compute."""

    def pm(r: dict[str, Any], m: str) -> str:
        return mean_std(r.get(f"{m}_mean"), r.get(f"{m}_std"), r.get("seeds"))

    rows = []
    for r in results["table"]:
        rows.append({"strategy": r["strategy"], "budget": f"{r['budget']} ({r['n']})",
                     "fixed-set before": format_value(r["before_fixed_set_accuracy"], "accuracy"),
                     "fixed-set after": pm(r, "fixed_set_accuracy"),
                     "white-box before": format_value(r["before_whitebox_accuracy"], "accuracy"),
                     "white-box after": pm(r, "whitebox_accuracy"),
                     "AutoAttack before": format_value(r.get("before_autoattack_accuracy"), "accuracy"),
                     "AutoAttack after": pm(r, "autoattack_accuracy"),
                     "clean before": format_value(r["before_clean_accuracy"], "accuracy"),
                     "clean after": pm(r, "clean_accuracy")})
    aa = any("autoattack_accuracy_mean" in r for r in results["table"])
    cols = ["strategy", "budget", "fixed-set before", "fixed-set after", "white-box before", "white-box after",
            *(["AutoAttack before", "AutoAttack after"] if aa else []), "clean before", "clean after"]
    passes = [r.get("compute_passes_mean") for r in results["table"]]
    if any(v is not None for v in passes):
        for row, v in zip(rows, passes):
            row["passes (k)"] = "-" if v is None else f"{v / 1e3:.1f}"
        cols.append("passes (k)")
    return rows, cols


def paired_table(paired: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]], list[str]] | None:
    """``(heading, rows, columns)`` of the paired differences to random selection (``results["paired_vs_random"]``):
    one row per (strategy, budget), one column per metric present, and the verdict; None without any."""
    if not paired:
        return None
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    by_row: dict[tuple[str, str], list[dict[str, Any]]] = {}
    seeds = sorted({int(p["n_seeds"]) for p in paired})
    for p in paired:
        key = (p["strategy"], str(p["budget"]))
        row = rows.setdefault(key, {"strategy": p["strategy"], "budget": p["budget"]})
        row[PAIRED_LABELS.get(p["metric"], p["metric"])] = paired_cell(p)
        by_row.setdefault(key, []).append(p)
    for key, row in rows.items():
        row["verdict"] = paired_verdict(by_row[key])
    cols = ["strategy", "budget"] + [v for v in PAIRED_LABELS.values() if any(v in r for r in rows.values())] + \
        ["verdict"]
    heading = (f"\npaired by seed, strategy minus random: mean [95 % t-interval] over {', '.join(map(str, seeds))} "
               "seed(s); * = the interval excludes 0")
    return heading, [{c: r.get(c, "-") for c in cols} for r in rows.values()], cols


def paired_cell(p: dict[str, Any]) -> str:
    """``+0.031 [+0.010, +0.052] *``: a paired difference, its interval and the mark when it excludes 0."""
    mean, lo, hi = p.get("mean_diff"), p.get("ci_low"), p.get("ci_high")
    if mean is None:
        return "-"
    if lo is None or hi is None:
        return f"{mean:+.3f}"
    mark = " *" if lo > 0 or hi < 0 else ""
    return f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]{mark}"
