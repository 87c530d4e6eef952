"""The console tables of run and compare (robustest.robot.tables)."""

from __future__ import annotations

from robustest.robot.report import plus_minus
from robustest.robot.tables import compare_table, loop_table, paired_cell, paired_table


def _rob(clean: float, fixed: float, wb: float, aa: float | None = None) -> dict:
    return {"clean_accuracy": clean, "fixed_set_accuracy": fixed, "whitebox_accuracy": wb, "autoattack_accuracy": aa}


def test_loop_table_has_a_row_per_round_and_autoattack_only_when_measured():
    results = {"baseline": _rob(0.9, 0.1, 0.2), "convergence_rule": {"round0": {"fol": {"median": 0.5}}},
               "rounds": [{"round": 1, "selected": {"n": 30}, "robustness": _rob(0.88, 0.6, 0.4),
                           "convergence": {"statistic": 0.25}}]}
    rows, cols = loop_table(results)
    assert cols == ["round", "selected", "clean accuracy", "fixed-set accuracy", "white-box accuracy", "median FOL"]
    assert rows[0] == {"round": 0, "selected": 0, "clean accuracy": 0.9, "fixed-set accuracy": 0.1,
                       "white-box accuracy": 0.2, "AutoAttack accuracy": None, "median FOL": 0.5}
    assert (rows[1]["round"], rows[1]["selected"], rows[1]["white-box accuracy"], rows[1]["median FOL"]) == \
        (1, 30, 0.4, 0.25)
    results["baseline"]["autoattack_accuracy"] = 0.15
    assert loop_table(results)[1][-2:] == ["AutoAttack accuracy", "median FOL"]


def _compare_row(**extra) -> dict:
    row = {"strategy": "best", "budget": "10%", "n": 5, "seeds": 1, "before_fixed_set_accuracy": 0.0,
           "before_whitebox_accuracy": 0.2, "before_clean_accuracy": 0.9}
    for m in ("fixed_set_accuracy", "whitebox_accuracy", "clean_accuracy"):
        row[f"{m}_mean"], row[f"{m}_std"] = 1.0, 0.0
    return {**row, **extra}


def test_compare_table_says_n_for_one_seed_and_adds_columns_only_when_recorded():
    row = _compare_row()
    rows, cols = compare_table({"table": [row]})
    assert cols == ["strategy", "budget", "fixed-set before", "fixed-set after", "white-box before", "white-box after",
                    "clean before", "clean after"]
    assert rows[0]["budget"] == "10% (5)" and rows[0]["white-box before"] == "0.200"
    assert rows[0]["fixed-set after"] == "1.000 (n = 1)" and plus_minus(row, "clean_accuracy") == "1.000 (n = 1)"
    assert plus_minus({**row, "seeds": 3, "clean_accuracy_std": 0.01}, "clean_accuracy") == "1.000 ± 0.010"
    rows, cols = compare_table({"table": [_compare_row(autoattack_accuracy_mean=0.5, compute_passes_mean=2500),
                                          _compare_row(strategy="random")]})
    assert cols[6:8] == ["AutoAttack before", "AutoAttack after"] and cols[-1] == "passes (k)"
    assert [r["passes (k)"] for r in rows] == ["2.5", "-"]


def test_paired_cell_marks_intervals_that_exclude_zero():
    assert paired_cell({"mean_diff": 0.031, "ci_low": 0.01, "ci_high": 0.052}) == "+0.031 [+0.010, +0.052] *"
    assert paired_cell({"mean_diff": -0.02, "ci_low": -0.05, "ci_high": -0.01}) == "-0.020 [-0.050, -0.010] *"
    assert paired_cell({"mean_diff": -0.02, "ci_low": -0.05, "ci_high": 0.01}) == "-0.020 [-0.050, +0.010]"
    assert paired_cell({"mean_diff": 0.0, "ci_low": 0.0, "ci_high": 0.01}) == "+0.000 [+0.000, +0.010]"  # 0 inside
    assert paired_cell({"mean_diff": -0.02, "ci_low": None, "ci_high": None}) == "-0.020"
    assert paired_cell({"mean_diff": None, "ci_low": None, "ci_high": None}) == "-"


def test_paired_table_has_one_row_per_strategy_and_budget():
    assert paired_table([]) is None

    def p(strategy, metric, mean, lo, hi, seeds=3):
        return {"strategy": strategy, "budget": "5%", "metric": metric, "mean_diff": mean, "ci_low": lo,
                "ci_high": hi, "n_seeds": seeds}

    heading, rows, cols = paired_table([p("best", "whitebox_accuracy", 0.05, 0.01, 0.09),
                                        p("best", "clean_accuracy", -0.01, -0.03, 0.01),
                                        p("gini", "whitebox_accuracy", -0.02, -0.05, 0.01, seeds=2)])
    assert heading == ("\npaired by seed, strategy minus random: mean [95 % t-interval] over 2, 3 seed(s); "
                       "* = the interval excludes 0")
    assert cols == ["strategy", "budget", "white-box vs random", "clean vs random", "verdict"]
    assert rows[0]["white-box vs random"] == "+0.050 [+0.010, +0.090] *"
    assert rows[1]["clean vs random"] == "-" and rows[1]["strategy"] == "gini"
    assert [r["verdict"] for r in rows] == ["better than random on white-box", "not distinguishable from random"]
