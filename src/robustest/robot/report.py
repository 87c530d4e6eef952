"""The outputs of a RobOT run or comparison: results.json (the results contract: format
``robustest-run-results`` for the loop, ``robustest-compare-results`` for a comparison), timings.json,
summary.csv and report.html."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from robustest.core.atomic import atomic_write_json
from robustest.report import (
    HtmlReport,
    format_value,
    mean_std,
    plural,
    save_bars,
    save_image_grid,
    save_lines,
    write_csv,
)
from robustest.results import RESULTS_VERSION, document, results_format
from robustest.robot.config import DEFAULT_STRATEGIES, HARDEN_STRATEGIES, RobotConfig
from robustest.robot.pool import Pool
from robustest.robot.setup import RunSetup, log_progress

RESULTS_FORMATS = {"loop": results_format("run"), "compare": results_format("compare")}
RESULTS_FORMAT = RESULTS_FORMATS["loop"]  # the loop's; a comparison writes RESULTS_FORMATS["compare"]
_VERB = {"loop": "run", "compare": "compare"}
_LOOP_ONLY = ("strategy", "budget", "rounds", "time_budget", "target", "target_metric", "convergence_tol",
              "convergence_patience", "convergence_probe")
_COMPARE_ONLY = ("strategies", "budgets", "seeds")
_WHITEBOX = ("whitebox_limit", "whitebox_pgd_steps", "whitebox_restarts", "apgd_steps", "whitebox_last", "autoattack")
#: what each autoattack version runs (robustest.evaluate.ensemble_plan), for the report's text
_AA_PLAN = {"fast": "APGD-CE 100 steps, then APGD-T on the 3 most likely other classes",
            "standard": "APGD-CE, APGD-T, FAB-T and Square, AutoAttack's standard version"}
_COVERAGE = ("coverage_metric", "coverage_options", "coverage_profile_limit")
#: loop settings that only a selection strategy uses (a harden strategy such as adv-train generates its own
#: examples every batch); pool_pgd_steps stays: the convergence probe attacks with it
_SELECTION_ONLY = ("budget", "pool", "pool_limit", "fuzz_options", "examples")


# ------------------------------------------------------------------------------------------- outputs
def settings_in_effect(cfg: RobotConfig, kind: str, device: Any = None) -> dict[str, Any]:
    """The settings of ``cfg`` that the run of ``kind`` ("loop" or "compare") used: unset options, options of the
    other kind, of strategies and pools not used and of a measurement switched off are left out; a comparison
    records its budgets (``budget`` when ``budgets`` is unset)."""
    d = {k: v for k, v in cfg.result_dict().items() if v is not None and v != {}}
    if cfg.model is not None or cfg.model_factory is not None:
        d.pop("train_model", None)
        d.pop("train_epochs", None)
    if not cfg.torchscript:
        d.pop("torchscript", None)
    if kind == "loop":
        used = [cfg.strategy]
        for k in _COMPARE_ONLY:
            d.pop(k, None)
        if cfg.strategy in HARDEN_STRATEGIES:  # adversarial training: no pool, no selection, no budget
            for k in _SELECTION_ONLY:
                d.pop(k, None)
        if cfg.target is None:
            d.pop("target_metric", None)
    else:
        used = list(cfg.strategies or DEFAULT_STRATEGIES)
        d["strategies"] = used
        d["budgets"] = list(cfg.budgets) if cfg.budgets is not None else [cfg.budget]
        for k in _LOOP_ONLY:
            d.pop(k, None)
        if cfg.pool != "attack":
            d.pop("pool_pgd_steps", None)
    if "kmst" not in used:
        d.pop("kmst_k", None)
    if "stratified" not in used:
        d.pop("stratified_bins", None)
    if "coverage" not in used and cfg.pool != "cov-fuzz":
        for k in _COVERAGE:
            d.pop(k, None)
    if cfg.pool == "attack":
        d.pop("fuzz_options", None)
    if not cfg.whitebox:
        for k in _WHITEBOX:
            d.pop(k, None)
    if device is not None:
        d["device"] = str(device)
    return d


def report_title(results: dict[str, Any]) -> str:
    """The title of a run's or comparison's report: what ran, on which model and data set."""
    d = results["data"]
    m = d.get("model") or {}
    model = m.get("name") or m.get("factory") or m.get("class") or m.get("kind") or "the model"
    if results["kind"] == "loop":
        return f"robustest run: RobOT loop of {model} on {d['dataset']}"
    return f"robustest compare: selection strategies for {model} on {d['dataset']}"


def _flat_timings(timings: dict[str, Any]) -> dict[str, float]:
    """Seconds per stage for results.json (per-round and per-cell detail stays in timings.json)."""
    flat: dict[str, float] = {f"setup_{k}": float(v) for k, v in (timings.get("setup") or {}).items()
                              if isinstance(v, (int, float))}
    if "pool_s" in timings:
        flat["pool_s"] = float(timings["pool_s"])
    for key in ("rounds", "cells"):
        done = timings.get(key) or []
        if done:
            flat[f"{key}_s"] = float(sum(t.get("total_s", t.get("seconds", 0.0)) for t in done))
    flat["total_s"] = float(timings.get("elapsed_s", 0.0))
    return flat


def write_outputs(out: Path, results: dict[str, Any], timings: dict[str, Any], setup: RunSetup, cfg: RobotConfig,
                   *, fol_by_round: dict[int, torch.Tensor] | None, examples: Pool | None,
                   compare_data: dict[str, Any] | None) -> None:
    """Write results.json (``results`` is turned into the contract's document IN PLACE, so the caller returns
    what was written), timings.json, summary.csv and report.html."""
    kind = results["kind"]
    body = {k: v for k, v in results.items() if k not in ("format", "version")}
    doc = document(_VERB[kind], settings_in_effect(cfg, kind, setup.device), body, _flat_timings(timings))
    results.clear()
    results.update(doc)
    assert results["version"] == RESULTS_VERSION
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
        log_progress(cfg, f"report.html skipped: {exc}")


def _summary_row(r: int, rob: dict[str, Any], rec: dict[str, Any] | None, last: dict[str, Any] | None
                 ) -> dict[str, Any]:
    row = {"round": r, "pool": rec["pool"]["size"] if rec else None, "selected": rec["selected"]["n"] if rec else 0,
            "clean_accuracy": rob["clean_accuracy"], "fixed_set_accuracy": rob["fixed_set_accuracy"],
            "whitebox_pgd_accuracy": rob["whitebox_pgd_accuracy"],
            "whitebox_apgd_accuracy": rob["whitebox_apgd_accuracy"], "whitebox_accuracy": rob["whitebox_accuracy"],
            "last_epoch_fixed_set_accuracy": last["fixed_set_accuracy"] if last else None,
            "median_fol": rec["convergence"]["statistic"] if rec else None,
            "fol_rel_change": rec["convergence"]["rel_change"] if rec else None}
    if rob.get("autoattack_accuracy") is not None:  # measured (config autoattack): after the white-box figures
        items = list(row.items())
        at = [k for k, _ in items].index("whitebox_accuracy") + 1
        row = dict(items[:at] + [("autoattack_accuracy", rob["autoattack_accuracy"])] + items[at:])
    return row


_METRIC_WORDS = {"fixed_set_accuracy": "fixed-set", "whitebox_accuracy": "white-box", "clean_accuracy": "clean",
                 "autoattack_accuracy": "AutoAttack"}


def paired_verdict(rows: list[dict[str, Any]]) -> str:
    """One strategy's paired rows (one per metric) in words: which figures its 95 % intervals put above or below
    random's, e.g. ``better than random on white-box, fixed-set; worse on clean``, or ``not distinguishable from
    random`` when every interval holds 0 (``no interval (1 seed)`` when there is none)."""
    if all(p.get("ci_low") is None for p in rows):
        return "no interval (1 seed)"
    order = sorted(rows, key=lambda p: -abs(p.get("mean_diff") or 0.0))
    up = [_METRIC_WORDS.get(p["metric"], p["metric"]) for p in order if p.get("ci_low") is not None
          and p["ci_low"] > 0]
    down = [_METRIC_WORDS.get(p["metric"], p["metric"]) for p in order if p.get("ci_high") is not None
            and p["ci_high"] < 0]
    if not up and not down:
        return "not distinguishable from random"
    parts = ([f"better than random on {', '.join(up)}"] if up else []) + \
        ([f"{'worse' if up else 'worse than random'} on {', '.join(down)}"] if down else [])
    return "; ".join(parts)


def _names(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def compare_verdict(results: dict[str, Any]) -> str:
    """A comparison's conclusion in one sentence: the strategy ending with the highest robustness (AutoAttack
    accuracy when measured, else white-box, else fixed-set; mean over seeds) against the original model's, then
    which strategies the paired 95 % intervals put above or below random selection."""
    table = results["table"]
    metric = next((m for m in ("autoattack_accuracy", "whitebox_accuracy", "fixed_set_accuracy")
                   if any(r.get(f"{m}_mean") is not None for r in table)), None)
    if metric is None:
        return "Verdict: no robustness figure was measured."
    best = max(r[f"{metric}_mean"] for r in table if r.get(f"{metric}_mean") is not None)
    tops = [r for r in table if r.get(f"{metric}_mean") == best]
    several = len({str(r["budget"]) for r in table if r["budget"] != "online"}) > 1  # online: no pool, no budget
    names = _names([f"{r['strategy']} ({r['budget']})" if several else r["strategy"] for r in tops])
    text = (f"Verdict: {names} {'ends' if len(tops) == 1 else 'end'} with the highest {_METRIC_WORDS[metric]} "
            f"accuracy, {plus_minus(tops[0], metric)} over {plural(tops[0]['seeds'], 'seed')}, from "
            f"{_acc(tops[0].get(f'before_{metric}'))} for the original model")
    groups: dict[str, list[str]] = {}
    by_cell: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in results.get("paired_vs_random") or []:
        by_cell.setdefault((p["strategy"], str(p["budget"])), []).append(p)
    for (strategy, budget), rows in by_cell.items():
        label = f"{strategy} ({budget})" if several else strategy
        groups.setdefault(paired_verdict(rows).replace("; worse on", ", but worse on"), []).append(label)
    if not groups:
        return text + "; random selection did not run, so nothing is compared with it."
    if set(groups) == {"no interval (1 seed)"}:
        return text + "; with one seed there is no interval for the paired comparison with random selection."
    parts = [f"{_names(who)} {'is' if len(who) == 1 else 'are'} {v}" for v, who in groups.items()
             if v != "no interval (1 seed)"]
    return text + "; paired with random selection by seed (95 % intervals), " + "; ".join(parts) + "."


_STOPPED = {"rounds": "all rounds ran", "time": "the time budget was spent", "requirement": "the requirement was met",
            "converged": "the median FOL converged"}


def loop_verdict(results: dict[str, Any]) -> str:
    """A RobOT run's conclusion in one sentence: the robustness of the original model and after the last round
    (AutoAttack accuracy when measured, else white-box, else fixed-set) and why the loop stopped."""
    base, rounds = results["baseline"], results["rounds"]
    last = rounds[-1]["robustness"] if rounds else base
    metric = next((m for m in ("autoattack_accuracy", "whitebox_accuracy", "fixed_set_accuracy")
                   if base.get(m) is not None and last.get(m) is not None), "clean_accuracy")
    return (f"Verdict: {_METRIC_WORDS[metric]} accuracy went from {_acc(base.get(metric))} (original model) to "
            f"{_acc(last.get(metric))} after {plural(results['rounds_completed'], 'round')}; clean accuracy from "
            f"{_acc(base.get('clean_accuracy'))} to {_acc(last.get('clean_accuracy'))}; stopped: "
            f"{_STOPPED.get(results['stop_reason'], results['stop_reason'])}.")


def plus_minus(row: dict[str, Any], metric: str) -> str:
    """``mean ± std`` of a comparison row's metric over its seeds, 3 decimals (``mean (n = 1)`` for one seed)."""
    return mean_std(row.get(f"{metric}_mean"), row.get(f"{metric}_std"), row.get("seeds"))


def _acc(v: Any) -> str:
    return format_value(v, "accuracy")


def _write_report(out: Path, results: dict[str, Any], setup: RunSetup, cfg: RobotConfig,
                  fol_by_round: dict[int, torch.Tensor] | None, examples: Pool | None,
                  compare_data: dict[str, Any] | None) -> None:
    rep = HtmlReport.from_results(results, report_title(results))
    rep.headline(loop_verdict(results) if results["kind"] == "loop" else compare_verdict(results))
    _describe_setup(rep, results["data"], cfg)
    if results["kind"] == "loop":
        _loop_sections(rep, results, cfg, fol_by_round, examples)
    else:
        _compare_sections(rep, results, cfg, compare_data)
    rep.write(out / "report.html")


def _describe_setup(rep: HtmlReport, d: dict[str, Any], cfg: RobotConfig) -> None:
    """The report's opening: the model, the data splits, eps, the fixed adversarial set and how robustness is
    measured."""
    fixed = d["fixed_set"]
    by_attack = ", ".join(f"{k} {v}" for k, v in fixed["by_attack"].items())
    rep.paragraph(f"Model {d['model'].get('name') or d['model'].get('kind')} on {d['dataset']}: {d['num_fit']} "
                  f"training images for fine-tuning, {d['num_val']} validation images (checkpoint selection), "
                  f"{d['num_test']} test images. eps = {format_value(cfg.eps)} (L-inf). Fixed adversarial set: "
                  f"{fixed['size']} successful FGSM/PGD examples of the test split against the original model "
                  f"({by_attack}).")
    n_wb = d["num_test"] if cfg.whitebox_limit is None else min(cfg.whitebox_limit, d["num_test"])
    rep.paragraph("Robustness measures: clean accuracy; accuracy on the fixed adversarial set (the paper's "
                  "measure; 0 for the original model); white-box accuracy of the retrained model itself "
                  f"(per-sample worst case of PGD {cfg.whitebox_pgd_steps} steps x {cfg.whitebox_restarts} "
                  f"restarts and APGD-CE {cfg.apgd_steps} steps, first {n_wb} test images)"
                  + ("." if cfg.autoattack is None else
                     f"; AutoAttack accuracy: robust accuracy under robustest.evaluate's {cfg.autoattack} ensemble "
                     f"({_AA_PLAN[cfg.autoattack]}) on the same images."))


def _loop_sections(rep: HtmlReport, results: dict[str, Any], cfg: RobotConfig,
                   fol_by_round: dict[int, torch.Tensor] | None, examples: Pool | None) -> None:
    """A run's report: robustness per round (plot and table), the FOL of fresh PGD tests per round, the first
    selected tests."""
    base = results["baseline"]
    rounds = results["rounds"]
    rep.heading("Robustness per round")
    how = (f"Strategy {cfg.strategy}: adversarial training ({HARDEN_STRATEGIES[cfg.strategy]}) against the current "
           "model every round, no pool and no budget" if cfg.strategy in HARDEN_STRATEGIES else
           f"Strategy {cfg.strategy}, budget {cfg.budget} per round, pool {cfg.pool}")
    rep.paragraph(f"{how}. Stopped: {results['stop_reason']} after {plural(results['rounds_completed'], 'round')}.")
    xs = list(range(len(rounds) + 1))
    series = {}
    for m, label in (("clean_accuracy", "clean"), ("fixed_set_accuracy", "fixed set"),
                     ("whitebox_accuracy", "white-box"), ("autoattack_accuracy", "AutoAttack")):
        ys = [base.get(m)] + [rec["robustness"].get(m) for rec in rounds]
        if all(v is not None for v in ys):
            series[label] = (xs, ys)
    if series:
        rep.image(save_lines(series, None, title="robustness per round", xlabel="round", ylabel="accuracy"),
                  "Accuracy per round (round 0 = the original model).")
    figs = ["clean_accuracy", "fixed_set_accuracy", "whitebox_accuracy"]
    if base.get("autoattack_accuracy") is not None:
        figs.append("autoattack_accuracy")
    cols = ["round", "pool", "selected", *figs, "median_fol", "fol_rel_change"]
    rows = [{"round": 0, "pool": None, "selected": 0, **{k: base.get(k) for k in figs},
             "median_fol": results["convergence_rule"]["round0"]["fol"]["median"], "fol_rel_change": None}]
    for rec in rounds:
        rows.append({"round": rec["round"], "pool": rec["pool"]["size"], "selected": rec["selected"]["n"],
                     **{k: rec["robustness"].get(k) for k in figs},
                     "median_fol": rec["convergence"]["statistic"],
                     "fol_rel_change": rec["convergence"]["rel_change"]})
    rep.table(rows, cols)
    if fol_by_round:
        rep.heading("FOL distribution of fresh PGD tests per round")
        rep.paragraph(f"Convergence rule: stop when the median FOL changes by less than "
                      f"{format_value(cfg.convergence_tol)} (relative) for {cfg.convergence_patience} "
                      "consecutive rounds.")
        rep.histogram({f"round {r}": v for r, v in sorted(fol_by_round.items())},
                      "FOL per round (lower and more concentrated = closer to convergence)",
                      title="FOL of fresh PGD tests", xlabel="FOL", bins=40)
    if examples is not None and len(examples):
        k = min(cfg.examples, len(examples))
        rep.heading("Example selected tests")
        rep.image(save_image_grid(examples.x[:k], None, captions=[
            f"y={int(examples.y[i])} FOL={float(examples.fol[i]):.3g}" for i in range(k)]), "First selected tests.")


def _compare_sections(rep: HtmlReport, results: dict[str, Any], cfg: RobotConfig,
                      compare_data: dict[str, Any] | None) -> None:
    """A comparison's report: the table per strategy and budget, the paired verdicts against random, a bar chart
    per robustness figure, the FOL of the pool and of each strategy's selection, example tests."""
    table = results["table"]
    rep.heading("Robustness per strategy and budget")
    rows = [{"strategy": r["strategy"], "budget": f"{r['budget']} ({r['n']})", "seeds": r["seeds"],
             "fixed set before": _acc(r["before_fixed_set_accuracy"]),
             "fixed set after": plus_minus(r, "fixed_set_accuracy"),
             "white-box before": _acc(r["before_whitebox_accuracy"]),
             "white-box after": plus_minus(r, "whitebox_accuracy"),
             **({"AutoAttack before": _acc(r["before_autoattack_accuracy"]),
                 "AutoAttack after": plus_minus(r, "autoattack_accuracy")} if "autoattack_accuracy_mean" in r else {}),
             "clean after": plus_minus(r, "clean_accuracy"),
             "fixed set, last epoch": _acc(r.get("last_epoch_fixed_set_accuracy_mean")),
             "compute (passes)": "-" if r.get("compute_passes_mean") is None
             else f"{r['compute_passes_mean']:,.0f}"} for r in table]
    rep.table(rows, caption="Accuracies after retraining: mean ± sample standard deviation over seeds; "
              "budget = requested (tests selected; 'online' = adversarial training, no pool); before = the "
              "original model; compute = forward+backward passes over one image per cell (pool generation, "
              "selection scoring, fine-tuning and adversarial generation; results.json has the parts).")
    if results.get("paired_vs_random"):
        rep.significance(results["paired_vs_random"])
    _compare_bars(rep, table, results["baseline"])
    assert compare_data is not None
    pool: Pool = compare_data["pool"]
    rep.heading("FOL distribution of the pool and of each strategy's selection")
    rep.histogram({"pool": pool.fol}, "FOL of all pool tests", title="FOL of the pool", xlabel="FOL", bins=40)
    sel_fol = {s: pool.fol[i] for s, i in compare_data["selected"].items() if len(i)}
    if sel_fol:
        rep.histogram(sel_fol, "FOL of the tests each strategy selected (first budget, first seed)",
                      title="FOL of the selected tests", xlabel="FOL", bins=40)
    for s, ex in compare_data["examples"].items():
        if len(ex):
            rep.heading(f"Example tests selected by {s}", level=3)
            rep.image(save_image_grid(ex.x, None, captions=[
                f"y={int(ex.y[i])} FOL={float(ex.fol[i]):.3g}" for i in range(len(ex))]),
                f"First {len(ex)} tests selected by {s}.")


def _compare_bars(rep: HtmlReport, table: list[dict[str, Any]], base: dict[str, Any]) -> None:
    """One bar chart per robustness figure measured: its mean per strategy and budget over the seeds (error bars:
    standard deviation), next to the original model's."""
    for m, label in (("fixed_set_accuracy", "fixed-set accuracy"), ("whitebox_accuracy", "white-box accuracy"),
                     ("autoattack_accuracy", "AutoAttack accuracy")):
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
                      f"{label.capitalize()} per strategy and budget (error bars: standard deviation over "
                      f"seeds); the original model: {_acc(base.get(m))}.")
