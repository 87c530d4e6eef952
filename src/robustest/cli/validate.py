"""``robustest validate``: a weak-robust validation set and the model's errors on it under attacks and corruptions.

It writes results.json (the results contract; schema docs/schemas/validate.schema.json) and report.html to --out;
the description below is what ``--help`` shows.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from robustest.cli.analyze import add_analysis_args, analysis_options
from robustest.cli.args import (
    add_data_args,
    add_model_args,
    add_run_args,
    below_one,
    fraction,
    int_list,
    linf_eps_list,
    name_list,
    non_negative_int,
    positive_int,
)
from robustest.cli.loading import load_checked, load_data
from robustest.cli.output import log, out_dir, print_table, write_run, written
from robustest.cli.settings import data_settings, model_settings
from robustest.core.errors import ConfigError
from robustest.selection.strata import ALLOCATIONS
from robustest.weakrobust.weakset import DEFAULT_SUBSET_SIZE, STRATEGIES

ORDER = 61

DEFAULT_STRATEGY = "stratified"
"""validate's default --strategy: the one that predicted test robustness best in docs/WEAKROBUST.md."""

VALIDATE_DESCRIPTION = f"""robustest validate: a validation set chosen by local robustness and the model's errors on it.

Chooses training samples from an analysis (--analysis FILE from 'robustest analyze', or analysed inline) by
--strategy: 'weak' (the paper's rule: the weakest samples by --k, --fraction or --threshold, default
--threshold 0.5), 'weak-correct' (the same among correctly classified samples), 'stratified' (K samples drawn
across --strata quantile strata of the robustness score, errors weighted by stratum share: unbiased for the
training distribution) or 'random' (K at random); stratified and random take K from --k, --fraction or
--threshold, default {DEFAULT_SUBSET_SIZE}. Default: {DEFAULT_STRATEGY}: in the evidence experiment (docs/WEAKROBUST.md)
it was unbiased with the smallest estimation error and ranked models by test robustness as well as any training
subset, while the paper's weak set did clearly worse. Then measures the model's error on the set
under gradient attacks and common corruptions, next to the same errors on the test split; every perturbation
type is labelled a strength or a weakness (its error on the set above the mean of its family). Writes to --out:
  weakset.pt, weakset.json   the set (indices, labels, scores, rule; weights of a stratified set)
  validation.pt              per-sample outcomes under every perturbation and level
  results.json               settings in effect, errors per type, strengths and weaknesses, timings
  report.html                errors per perturbation type (weak set vs test split), the analysis, settings
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("validate", help="weak-robust validation set and the model's errors under perturbations",
                       description=VALIDATE_DESCRIPTION, formatter_class=raw)
    add_model_args(p)
    add_data_args(p, split="train")
    p.add_argument("--analysis", metavar="FILE", default=None,
                   help="analysis.pt from 'robustest analyze' (default: analyse inline)")
    add_analysis_args(p)
    g = p.add_argument_group("validation-set selection")
    g.add_argument("--strategy", choices=STRATEGIES, default=None,
                   help=f"weak: the paper's weakest samples; weak-correct: the weakest correctly classified ones; "
                        f"stratified: K drawn across robustness-score strata, errors weighted by stratum share; "
                        f"random: K at random (default: {DEFAULT_STRATEGY}, unbiased with the smallest estimation "
                        f"error in docs/WEAKROBUST.md; weak-correct with --correct-only, weak with --per-class)")
    g.add_argument("--strata", type=positive_int, default=10,
                   help="stratified: quantile strata of the robustness score (default: 10)")
    g.add_argument("--allocation", choices=ALLOCATIONS, default="proportional",
                   help="stratified: samples per stratum proportional to its size, or Neyman (size x pilot "
                        "standard deviation) (default: proportional)")
    sel = g.add_mutually_exclusive_group()
    sel.add_argument("--k", type=positive_int, default=None,
                     help=f"the K weakest samples (weak), or K samples (stratified, random; default: "
                          f"{DEFAULT_SUBSET_SIZE})")
    sel.add_argument("--fraction", type=fraction, default=None,
                     help="the weakest fraction of the samples (weak), or as many samples (stratified, random)")
    sel.add_argument("--threshold", type=below_one, default=None,
                     help="samples with more than this share of neighbours misclassified (weak; paper and default "
                          "there: 0.5), or as many samples (stratified, random)")
    g.add_argument("--per-class", action="store_true", help="weak strategies: balance the set over the classes")
    g.add_argument("--correct-only", action="store_true",
                   help="rank only samples classified correctly (= --strategy weak-correct)")
    g = p.add_argument_group("perturbations")
    g.add_argument("--perturbations", type=name_list("perturbation"), default=["all"], metavar="LIST",
                   help="'all', 'attacks', 'corruptions' or names of attacks/corruptions, comma-separated "
                        "(default: all)")
    g.add_argument("--attack-eps", type=linf_eps_list("attack eps"), default=None, metavar="LIST",
                   help="L-inf budgets of the attacks, comma-separated (default: 0.05,0.1,0.2 for grey, "
                        "2/255,4/255,8/255 for colour)")
    g.add_argument("--severities", type=int_list(what="severity", lo=1, hi=5, sort=True), default=[1, 2, 3, 4, 5],
                   metavar="LIST", help="corruption severities: 1-5, 1,3,5 or 1-2,5 (default: 1-5)")
    g.add_argument("--attack-steps", type=positive_int, default=None,
                   help="steps of the iterative attacks (default: each attack's own)")
    g.add_argument("--test-limit", type=non_negative_int, default=1000, metavar="N",
                   help="test-split samples evaluated for comparison (0: none; default: 1000)")
    add_run_args(p)
    p.set_defaults(func=run_validate)


def run_validate(args: argparse.Namespace) -> int:
    from robustest.weakrobust.reports import validation_report
    from robustest.weakrobust.validate_pipeline import validate_pipeline

    _resolve_strategy(args)
    t0 = time.perf_counter()
    model, ds = load_checked(args)
    out = out_dir(args)  # made once the data is known to fit: a refusal leaves nothing behind
    analysis, analysed_with = _validation_analysis(args, model, ds, out)
    t_analysis = time.perf_counter() - t0
    test = load_data(args, "test") if args.test_limit and args.test_limit > 0 else None
    vrun = validate_pipeline(model, ds, analysis, out=out, test=test, test_limit=args.test_limit,
                             select=dict(k=args.k, fraction=args.fraction, threshold=args.threshold,
                                         per_class=args.per_class, strategy=args.strategy, strata=args.strata,
                                         allocation=args.allocation),
                             perturbations=args.perturbations, eps=args.attack_eps, severities=tuple(args.severities),
                             attack_steps=args.attack_steps, seed=args.seed, progress=not args.no_progress,
                             analysis_s=t_analysis)
    if not args.analysis:
        vrun.files["analysis"] = "analysis.pt"
    weak, res = vrun.weak, vrun.result
    settings = {**model_settings(args), **data_settings(args), **analysed_with, **vrun.settings}
    doc = write_run(out, "validate", t0, settings, vrun.to_results(), vrun.timings,
                    lambda doc: validation_report(doc, args.dataset, args.split, ds, analysis, weak, res,
                                                  vrun.test_result, vrun.rows))
    print_table(vrun.rows, ["type", "family", "weak_error", "test_error", "label"])
    log.info(vrun.summary_line())
    written(out, doc["files"], t0)
    return 0


def _resolve_strategy(args: argparse.Namespace) -> None:
    """Set ``args.strategy`` from --strategy and the older flags (--correct-only, --per-class), which keep their
    meaning; a one-line ConfigError when a flag does not apply to the strategy."""
    if args.strategy is None:  # the old flags keep their meaning
        args.strategy = "weak-correct" if args.correct_only else "weak" if args.per_class else DEFAULT_STRATEGY
    if args.strategy in ("stratified", "random") and (args.correct_only or args.per_class):
        flag = "--correct-only" if args.correct_only else "--per-class"
        raise ConfigError(f"{flag} applies to --strategy weak or weak-correct, not {args.strategy}")
    if args.strategy == "weak" and args.correct_only:
        args.strategy = "weak-correct"


def _validation_analysis(args: argparse.Namespace, model, ds, out: Path) -> tuple[Any, dict[str, Any]]:
    """validate's analysis and how it was obtained, as results.json records it: read from --analysis (refused when
    it analyses other samples than ``ds``), or computed in saved steps and written to ``out/analysis.pt``."""
    from robustest import weakrobust as wr
    from robustest.weakrobust.analyze_pipeline import resumable_analysis
    from robustest.weakrobust.validate_pipeline import check_analysis_of

    if not args.analysis:
        options = analysis_options(args, model, ds)
        analysis = resumable_analysis(model, ds, out, options, progress=not args.no_progress)
        analysis.save(out / "analysis.pt")
        return analysis, options.settings(args.batch_size_auto)
    return check_analysis_of(wr.Analysis.load(args.analysis), ds, args.analysis,
                             f"--dataset {args.dataset} --split {args.split}"), {"analysis": str(args.analysis)}
