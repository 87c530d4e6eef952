"""``robustest analyze``: local robustness of every sample of a split (the first step of weak-robust validation).

It writes results.json (the results contract; schema docs/schemas/analyze.schema.json) and report.html to --out;
the description below is what ``--help`` shows. ``robustest validate`` shares its analysis options and helpers.
"""

from __future__ import annotations

import argparse
import time

from robustest.cli.args import (
    add_data_args,
    add_model_args,
    add_option_args,
    add_run_args,
    linf_eps,
    options_from_args,
    positive_int,
)
from robustest.cli.loading import load_checked, resolve_batch_size
from robustest.cli.output import log, out_dir, write_run, written
from robustest.cli.settings import data_settings, model_settings
from robustest.core.devices import model_device
from robustest.weakrobust.analyze_pipeline import AnalysisOptions

ORDER = 60

ANALYZE_DESCRIPTION = """robustest analyze: local robustness of every sample of a split.

Each sample gets Q noisy neighbours (--neighbors, uniform or Gaussian noise of width --eps, rounded to the 256
uint8 levels); its score is the mean probability the model gives to wrong classes over the neighbours (higher =
weaker). Writes to --out:
  analysis.pt   per-sample score, fraction of neighbours misclassified, top wrong class, clean correctness
  results.json  settings in effect, summary, the 20 weakest samples, timings
  report.html   score histograms, the weakest samples as images, settings and timings
"""


def add_analysis_args(p: argparse.ArgumentParser) -> None:
    add_option_args(p.add_argument_group("local robustness analysis"), AnalysisOptions,
                    ("neighbors", "eps", "noise", "no_quantize", "batch_size", "amp", "save_every"))


def add_parser(sub: argparse._SubParsersAction) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("analyze", help="local robustness analysis of every sample (weak-robust scores)",
                       description=ANALYZE_DESCRIPTION, formatter_class=raw)
    add_model_args(p)
    add_data_args(p, split="train")
    add_analysis_args(p)
    p.add_argument("--top", type=positive_int, default=32, help="weakest samples shown in the report (default: 32)")
    p.add_argument("--radius-eps-max", type=linf_eps, default=None, metavar="EPS",
                   help="also compute the smallest PGD L-inf budget that flips each sample (bisection up to EPS) "
                        "and its rank correlation with the score (costly: about 9 x 11 gradient passes)")
    add_run_args(p)
    p.set_defaults(func=run_analyze)



def analysis_options(args: argparse.Namespace, model, ds) -> AnalysisOptions:
    """The analysis options of the flags, --batch-size auto resolved for ``model`` and ``ds``."""
    from robustest import weakrobust as wr

    args.batch_size_auto = args.batch_size == "auto"
    if args.batch_size_auto:
        resolve_batch_size(args, model, ds, default=wr.default_batch_size(ds), grad=False, amp=args.amp)
    return AnalysisOptions(**options_from_args(AnalysisOptions, args), seed=args.seed)


def run_analyze(args: argparse.Namespace) -> int:
    from robustest.weakrobust.analyze_pipeline import analyze_pipeline
    from robustest.weakrobust.reports import analyze_report

    t0 = time.perf_counter()
    model, ds = load_checked(args)
    out = out_dir(args)  # made once the data is known to fit: a refusal leaves nothing behind
    options = analysis_options(args, model, ds)
    arun = analyze_pipeline(model, ds, out=out, options=options, radius_eps_max=args.radius_eps_max,
                            progress=not args.no_progress)
    analysis = arun.analysis
    settings = {**model_settings(args), **data_settings(args), **options.settings(args.batch_size_auto),
                "top": args.top, **({"radius_eps_max": args.radius_eps_max} if args.radius_eps_max else {}),
                "seed": args.seed, "device": str(model_device(model))}
    doc = write_run(out, "analyze", t0, settings, arun.to_results(), arun.timings,
                    lambda doc: analyze_report(doc, ds, analysis, arun.radius, args.top))
    log.info(arun.summary_line())
    written(out, doc["files"], t0)
    return 0
