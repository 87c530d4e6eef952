"""The outputs of a RobOT run or comparison: results.json, timings.json, summary.csv and report.html."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from robustest.robot.config import METRICS, RobotConfig
from robustest.robot.pool import Pool
from robustest.robot.setup import _log, _Setup
from robustest.runtime import atomic_write_json

RESULTS_FORMAT = "robustest-robot-results"
RESULTS_VERSION = 1


# ------------------------------------------------------------------------------------------- outputs
def _write_outputs(out: Path, results: dict[str, Any], timings: dict[str, Any], setup: _Setup, cfg: RobotConfig,
                   *, fol_by_round: dict[int, torch.Tensor] | None, examples: Pool | None,
                   compare_data: dict[str, Any] | None) -> None:
    from robustest.report import write_csv

    atomic_write_json(out / "results.json", results)
    atomic_write_json(out / "timings.json", timings)
    if results["kind"] == "loop":
        rows = [_summary_row(0, results["baseline"], None, None)]
        for rec in results["rounds"]:
            rows.append(_summary_row(rec["round"], rec["robustness"], rec, rec["robustness_last_epoch"]))
        write_csv(out / "summary.csv", rows)
    else:
        write_csv(out / "summary.csv", results["table"])
    try:
        _write_report(out, results, setup, cfg, fol_by_round, examples, compare_data)
    except ImportError as exc:  # matplotlib missing: results stay valid
        _log(cfg, f"report.html skipped: {exc}")


def _summary_row(r: int, rob: dict[str, Any], rec: dict[str, Any] | None, last: dict[str, Any] | None
                 ) -> dict[str, Any]:
    return {"round": r, "pool": rec["pool"]["size"] if rec else None, "selected": rec["selected"]["n"] if rec else 0,
            "clean_accuracy": rob["clean_accuracy"], "fixed_set_accuracy": rob["fixed_set_accuracy"],
            "whitebox_pgd_accuracy": rob["whitebox_pgd_accuracy"],
            "whitebox_apgd_accuracy": rob["whitebox_apgd_accuracy"], "whitebox_accuracy": rob["whitebox_accuracy"],
            "last_epoch_fixed_set_accuracy": last["fixed_set_accuracy"] if last else None,
            "median_fol": rec["convergence"]["statistic"] if rec else None,
            "fol_rel_change": rec["convergence"]["rel_change"] if rec else None}


def _write_report(out: Path, results: dict[str, Any], setup: _Setup, cfg: RobotConfig,
                  fol_by_round: dict[int, torch.Tensor] | None, examples: Pool | None,
                  compare_data: dict[str, Any] | None) -> None:
    from robustest.report import HtmlReport, save_bars, save_histogram, save_image_grid, save_lines

    d = results["data"]
    rep = HtmlReport("RobOT: robustness-oriented testing and retraining" if results["kind"] == "loop"
                     else "RobOT: selection strategy comparison")
    rep.paragraph(f"Model {d['model'].get('name')} on {d['dataset']}: {d['num_fit']} training images for "
                  f"fine-tuning, {d['num_val']} validation images (checkpoint selection), {d['num_test']} test "
                  f"images. eps = {cfg.eps} (L-inf). Fixed adversarial set: {d['fixed_set']['size']} successful "
                  f"FGSM/PGD examples of the test split against the original model {d['fixed_set']['by_attack']}.")
    n_wb = d["num_test"] if cfg.whitebox_limit is None else min(cfg.whitebox_limit, d["num_test"])
    rep.paragraph("Robustness measures: clean accuracy; accuracy on the fixed adversarial set (the paper's "
                  "measure; 0 for the original model); white-box accuracy of the retrained model itself "
                  f"(per-sample worst case of PGD {cfg.whitebox_pgd_steps} steps x {cfg.whitebox_restarts} "
                  f"restarts and APGD-CE {cfg.apgd_steps} steps, first {n_wb} test images).")
    base = results["baseline"]
    if results["kind"] == "loop":
        rounds = results["rounds"]
        rep.heading("Robustness per round")
        rep.paragraph(f"Strategy {cfg.strategy}, budget {cfg.budget} per round, pool {cfg.pool}. "
                      f"Stopped: {results['stop_reason']} after {results['rounds_completed']} round(s).")
        xs = list(range(len(rounds) + 1))
        series = {}
        for m, label in (("clean_accuracy", "clean"), ("fixed_set_accuracy", "fixed set"),
                         ("whitebox_accuracy", "white-box")):
            ys = [base.get(m)] + [rec["robustness"].get(m) for rec in rounds]
            if all(v is not None for v in ys):
                series[label] = (xs, ys)
        if series:
            rep.image(save_lines(series, None, title="robustness per round", xlabel="round", ylabel="accuracy"),
                      "accuracy per round (round 0 = original model)")
        rows = []
        rows.append({"round": 0, "pool": "-", "selected": 0, **{k: base.get(k) for k in METRICS}, "median FOL":
                     results["convergence_rule"]["round0"]["fol"]["median"], "rel. change": None})
        for rec in rounds:
            rows.append({"round": rec["round"], "pool": rec["pool"]["size"], "selected": rec["selected"]["n"],
                         **{k: rec["robustness"].get(k) for k in METRICS},
                         "median FOL": rec["convergence"]["statistic"],
                         "rel. change": rec["convergence"]["rel_change"]})
        rep.table(rows)
        if fol_by_round:
            rep.heading("FOL distribution of fresh PGD tests per round")
            rep.paragraph(f"Convergence rule: stop when the median FOL changes by less than {cfg.convergence_tol:g} "
                          f"(relative) for {cfg.convergence_patience} consecutive rounds.")
            rep.image(save_histogram({f"round {r}": v for r, v in sorted(fol_by_round.items())}, None,
                                     title="FOL of fresh PGD tests", xlabel="FOL", bins=40),
                      "FOL per round (lower and more concentrated = closer to convergence)")
        if examples is not None and len(examples):
            k = min(cfg.examples, len(examples))
            rep.heading("Example selected tests")
            rep.image(save_image_grid(examples.x[:k], None, captions=[
                f"y={int(examples.y[i])} FOL={float(examples.fol[i]):.3g}" for i in range(k)]), "first selected tests")
    else:
        table = results["table"]
        rep.heading("Robustness per strategy and budget (mean ± std over seeds)")
        cols = ["strategy", "budget", "n", "seeds", "before_fixed_set_accuracy", "fixed_set_accuracy_mean",
                "fixed_set_accuracy_std", "before_whitebox_accuracy", "whitebox_accuracy_mean",
                "whitebox_accuracy_std", "clean_accuracy_mean", "last_epoch_fixed_set_accuracy_mean"]
        rep.table(table, cols)
        for m, label in (("fixed_set_accuracy", "fixed-set accuracy"), ("whitebox_accuracy", "white-box accuracy")):
            groups: dict[str, dict[str, float]] = {}
            errs: dict[str, dict[str, float]] = {}
            if base.get(m) is not None:
                groups["original model"] = {str(row["budget"]): base[m] for row in table}
            for row in table:
                if row.get(f"{m}_mean") is None:
                    continue
                groups.setdefault(row["strategy"], {})[str(row["budget"])] = row[f"{m}_mean"]
                errs.setdefault(row["strategy"], {})[str(row["budget"])] = row[f"{m}_std"] or 0.0
            if groups:
                rep.image(save_bars(groups, None, title=f"{label} after retraining", ylabel="accuracy", errors=errs),
                          f"{label} per strategy (x axis: budget; original model: {base.get(m)})")
        assert compare_data is not None
        pool: Pool = compare_data["pool"]
        rep.heading("FOL distribution of the pool and of each strategy's selection")
        rep.image(save_histogram({"pool": pool.fol}, None, title="FOL of the pool", xlabel="FOL", bins=40),
                  "FOL of all pool tests")
        sel_fol = {s: pool.fol[i] for s, i in compare_data["selected"].items() if len(i)}
        if sel_fol:
            rep.image(save_histogram(sel_fol, None, title="FOL of the selected tests", xlabel="FOL", bins=40),
                      "FOL of the tests each strategy selected (first budget, first seed)")
        for s, ex in compare_data["examples"].items():
            if len(ex):
                rep.heading(f"Example tests selected by {s}", level=3)
                rep.image(save_image_grid(ex.x, None, captions=[
                    f"y={int(ex.y[i])} FOL={float(ex.fol[i]):.3g}" for i in range(len(ex))]),
                    f"first {len(ex)} tests selected by {s}")
    rep.heading("Settings")
    rep.preformatted(json.dumps(results["config"], indent=1, default=str))
    rep.write(out / "report.html")

