"""``robustest generate``: generate test inputs for a model with an adversarial attack or a fuzzer.

Methods: fgsm, pgd, bim, rfgsm, mifgsm, cw, apgd (white-box attacks, robustest.attacks) and fol-fuzz
(FOL-guided fuzzing, RobOT) or cov-fuzz (coverage-guided, DeepHunter-style; its coverage profile is built on
the train split). Seeds are the --split of --dataset (default: train, as in RobOT's test pool).

Writes to --out:
  tests.pt       the tests (x, label y, index of the seed in the split, method, FOL of each test); readable by
                 'robustest score' / 'robustest select' and by robustest.data.load_tests
  results.json   settings in effect, success rate, perturbation norms, FOL distribution (quantiles), timings
                 (schema: docs/schemas/generate.schema.json)
  report.html    summary, perturbation and FOL tables, example seeds and tests, FOL histogram
  summary.json   the figures of results.json without its header (kept for older scripts)
  examples.png   seeds (top row) and tests (bottom row), captioned "label -> prediction"
  fol_hist.png   histogram of the tests' FOL values
By default attacks keep only successful adversarial examples (prediction != label, RobOT's pool);
--keep-all keeps every attacked image. Fuzzers only ever return failing tests.
FOL is measured with --fol-norm/--fol-eps (default: --norm and --eps; for cw the largest L2 perturbation).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import fields, replace

from torch.utils.data import TensorDataset

from robustest import attacks
from robustest import data as datasets
from robustest.cli.args import (
    add_data_args,
    add_model_args,
    add_option_args,
    add_run_args,
    batch_size_arg,
    positive_int,
)
from robustest.cli.loading import load_checked, resolve_batch_size
from robustest.cli.output import log, out_dir, write_run, written
from robustest.cli.settings import data_settings, model_settings
from robustest.core.batching import image_shape
from robustest.core.errors import ConfigError
from robustest.fuzzing.generate import FUZZERS, GenerateOptions, default_eps, generate_report, threat_norm

ORDER = 30



def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate tests with an attack or a fuzzer", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_data_args(p, split="train")
    p.add_argument("--method", required=True, type=_method, metavar="METHOD",
                   help=f"an attack ({', '.join(attacks.names())}, or one registered with robustest.attacks."
                        f"register) or a fuzzer ({', '.join(FUZZERS)})")
    g = p.add_argument_group("attack options")
    add_option_args(g, GenerateOptions, ("eps", "norm", "steps", "alpha", "restarts", "random_start", "decay", "c",
                                         "kappa", "binary_steps", "keep_all"), {"norm": None})
    f = p.add_argument_group("fuzzing options")
    add_option_args(f, GenerateOptions, ("lr", "max_rel_l2", "fuzz_eps", "max_tests_per_seed", "time_budget",
                                         "iterations", "coverage", "k", "profile_limit"))
    s = p.add_argument_group("FOL of the tests")
    s.add_argument("--fol-norm", choices=("linf", "l2", "l1", "gradnorm"), default=None,
                   help="norm of the FOL stored with each test (default: --norm; gradnorm = ||grad||_2)")
    add_option_args(s, GenerateOptions, ("fol_eps",))
    p.add_argument("--batch-size", type=batch_size_arg, default=256, metavar="B",
                   help="images per batch, or 'auto': the largest that fits the GPU with the gradients (the "
                        "default 256 on the CPU)")
    p.add_argument("--grid", type=positive_int, default=8, help="examples shown in examples.png (default: 8)")
    add_run_args(p)
    p.set_defaults(func=run)


# ---------------------------------------------------------------------------------------------- helpers
def _method(text: str) -> str:
    """--method: a fuzzer or an attack of the registry (any spelling it knows), as written."""
    if text in FUZZERS:
        return text
    try:
        attacks.get(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"unknown method {text!r}: choose an attack ({', '.join(attacks.names())})"
                                         f" or a fuzzer ({', '.join(FUZZERS)})") from None
    return text


# ------------------------------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    """Generate the tests of ``args.method`` and write tests.pt, summary.json, results.json, report.html."""
    from robustest.fuzzing.generate_pipeline import generate_pipeline

    t0 = time.perf_counter()
    given = {f.name: getattr(args, f.name) for f in fields(GenerateOptions) if f.name not in ("norm", "batch_size")}
    opts = GenerateOptions(**given, norm=threat_norm(args.method, args.norm))
    opts.check_radii(args.fol_norm)  # before any work
    model, ds = load_checked(args)
    resolve_batch_size(args, model, ds, default=256, grad=True)
    out = out_dir(args)  # made once the data is known to fit: a refusal leaves nothing behind
    eps = args.eps if args.eps is not None else default_eps(image_shape(ds)[0])
    opts = replace(opts, batch_size=args.batch_size)  # "auto" resolved
    profile = _train_for_profile(args) if args.method == "cov-fuzz" and not args.keep_all and len(ds) else None
    grun = generate_pipeline(opts, model, ds, out=out, eps=eps, fol_norm=args.fol_norm, profile=profile,
                             grid=args.grid, seed=args.seed, progress=not args.no_progress,
                             source={"dataset": args.dataset, "split": args.split,
                                     "checkpoint": str(args.checkpoint or args.model_factory or args.weights)},
                             load_s=time.perf_counter() - t0)
    settings = {**model_settings(args), **data_settings(args), **grun.settings,
                **({"batch_size_auto": True} if args.batch_size_auto else {})}  # set by resolve_batch_size
    doc = write_run(out, "generate", t0, settings, grun.to_results(), grun.timings,
                    lambda doc: generate_report(doc, args.method, grun.grid, grun.fol))
    log.info(grun.summary_line(doc["timings"]["total_s"]))
    written(out, doc["files"], t0)
    return 0


def _train_for_profile(args: argparse.Namespace):
    ds = datasets.load(args.dataset, root=args.data_dir, split="train")
    if args.profile_limit is not None and args.profile_limit < len(ds):
        ds = TensorDataset(*(t[:args.profile_limit] for t in ds.tensors))
    return ds
