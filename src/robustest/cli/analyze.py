"""``robustest analyze``: local robustness of every sample of a split (the first step of weak-robust validation).

It writes results.json (the results contract; schema docs/schemas/analyze.schema.json) and report.html to --out;
the description below is what ``--help`` shows. ``robustest validate`` shares its analysis options and helpers.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from robustest.cli.args import (
    add_checkpoint_arg,
    add_data_args,
    add_run_args,
    batch_size_arg,
    linf_eps,
    noise_width,
    positive_int,
)
from robustest.cli.loading import load_checked, resolve_batch_size
from robustest.cli.output import fmt, log, out_dir, write_run, written
from robustest.cli.settings import data_settings, model_settings
from robustest.core.devices import model_device
from robustest.weakrobust.analyze_pipeline import ANALYSIS_STEP, AnalysisOptions

ORDER = 60

ANALYZE_DESCRIPTION = """robustest analyze: local robustness of every sample of a split.

Each sample gets Q noisy neighbours (--neighbors, uniform or Gaussian noise of width --eps, rounded to the 256
uint8 levels); its score is the mean probability the model gives to wrong classes over the neighbours (higher =
weaker). Writes to --out:
  analysis.pt   per-sample score, fraction of neighbours misclassified, top wrong class, clean correctness
  results.json  settings in effect, summary, the 20 weakest samples, timings
  report.html   score histograms, the weakest samples as images, settings and timings
"""


def unit_fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0 <= v < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {v}")
    return v


def add_analysis_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("local robustness analysis")
    g.add_argument("--neighbors", type=positive_int, default=50, help="noisy neighbours per sample (default: 50)")
    g.add_argument("--noise-width", "--eps", dest="eps", type=noise_width, default=0.22, metavar="W",
                   help="width of the neighbours' noise, not an attack radius: delta ~ U[-W/2, W/2] per pixel "
                        "(default: 0.22; --eps is the same option, the name of the reference code)")
    g.add_argument("--noise", choices=("uniform", "gaussian"), default="uniform", help="noise law (default: uniform)")
    g.add_argument("--no-quantize", action="store_true", help="do not round neighbours to the 256 uint8 levels")
    g.add_argument("--batch-size", type=batch_size_arg, default=None, metavar="B",
                   help="images per forward pass, or 'auto': the largest that fits the GPU (on the CPU the "
                        "default: about 4 million pixel values' worth: 5349 images of 28x28, 341 of 3x64x64)")
    g.add_argument("--amp", choices=("bf16", "fp16"), default=None,
                   help="run the analysis's forward passes in bf16 (CPU or CUDA) or fp16 (CUDA) autocast: faster on "
                        "GPUs, scores rounded accordingly (default: float32)")
    g.add_argument("--save-every", type=positive_int, default=ANALYSIS_STEP, metavar="N",
                   help=f"save the analysis every N samples per process (under torchrun a step covers N x "
                        f"ranks samples); rerunning the same command after a kill continues from there "
                        f"(default: {ANALYSIS_STEP})")


def add_parser(sub: argparse._SubParsersAction) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("analyze", help="local robustness analysis of every sample (weak-robust scores)",
                       description=ANALYZE_DESCRIPTION, formatter_class=raw)
    add_checkpoint_arg(p)
    add_data_args(p, split="train")
    add_analysis_args(p)
    p.add_argument("--top", type=positive_int, default=32, help="weakest samples shown in the report (default: 32)")
    p.add_argument("--radius-eps-max", type=linf_eps, default=None, metavar="EPS",
                   help="also compute the smallest PGD L-inf budget that flips each sample (bisection up to EPS) "
                        "and its rank correlation with the score (costly: about 9 x 11 gradient passes)")
    add_run_args(p)
    p.set_defaults(func=run_analyze)


# ------------------------------------------------------------------------------------------- helpers


def analysis_options(args: argparse.Namespace, model, ds) -> AnalysisOptions:
    """The analysis options of the flags, --batch-size auto resolved for ``model`` and ``ds``."""
    from robustest import weakrobust as wr

    if args.batch_size == "auto":
        resolve_batch_size(args, model, ds, default=wr.default_batch_size(ds), grad=False, amp=args.amp)
    return AnalysisOptions(neighbors=args.neighbors, eps=args.eps, noise=args.noise, no_quantize=args.no_quantize,
                           batch_size=args.batch_size, amp=args.amp, seed=args.seed, save_every=args.save_every)


# --------------------------------------------------------------------------------------------- verbs
def analysis_settings(args: argparse.Namespace) -> dict[str, Any]:
    d = {"neighbors": args.neighbors, "eps": args.eps, "noise": args.noise, "quantize": not args.no_quantize}
    if args.batch_size is not None:
        d["batch_size"] = args.batch_size
    if getattr(args, "batch_size_auto", False):
        d["batch_size_auto"] = True
    if args.amp is not None:
        d["amp"] = args.amp
    return d


def run_analyze(args: argparse.Namespace) -> int:
    from robustest.weakrobust.analyze_pipeline import analyze_pipeline
    from robustest.weakrobust.reports import analyze_report

    t0 = time.perf_counter()
    model, ds = load_checked(args)
    out = out_dir(args)  # made once the data is known to fit: a refusal leaves nothing behind
    arun = analyze_pipeline(model, ds, out=out, options=analysis_options(args, model, ds),
                            radius_eps_max=args.radius_eps_max, progress=not args.no_progress)
    analysis = arun.analysis
    settings = {**model_settings(args), **data_settings(args), **analysis_settings(args), "top": args.top,
                **({"radius_eps_max": args.radius_eps_max} if args.radius_eps_max else {}), "seed": args.seed,
                "device": str(model_device(model))}
    doc = write_run(out, "analyze", t0, settings, arun.to_results(), arun.timings,
                    lambda doc: analyze_report(doc, ds, analysis, arun.radius, args.top))
    s = analysis.summary()
    log.info(f"analysed {len(analysis)} samples in {fmt(analysis.params['seconds'], 'analyze_s')} s: clean accuracy "
             f"{fmt(s['clean_accuracy'], 'accuracy')}, mean score {fmt(s['mean_score'])}, "
             f"{fmt(100 * s['frac_most_neighbours_wrong'])} % with most neighbours misclassified")
    written(out, doc["files"], t0)
    return 0
