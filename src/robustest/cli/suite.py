"""``robustest suite``: a robustness regression gate from a small stratified suite.

``robustest suite build`` scores a data split's samples by local robustness under the baseline model, draws K
samples stratified by that score (and class), runs the baseline's evaluation on them (AutoAttack's ensemble by
default, optionally common corruptions and, with --certify ibp|crown, which samples the baseline's certificate
proves) and writes ``suite.pt`` (a versioned file read with
``torch.load(weights_only=True)``; docs/SUITE.md), ``results.json`` and ``report.html`` to --out.

``robustest suite check`` runs the suite's stored attacks and corruptions on a candidate model and writes the
stratified robust accuracy with its 95 % interval and, against the baseline (the suite's stored outcomes, or
--baseline), the paired drop with its interval, the exact McNemar test and a verdict; a suite with certified
outcomes also compares the candidate's certificate (samples certified before and no longer are lost certificates).

Exit status (check): 0 no regression, 1 regression (the drop of robust, or certified, accuracy is significant at
--alpha AND larger than --max-drop), 2 bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from robustest.cli.args import (
    add_data_args,
    add_model_args,
    add_option_args,
    add_output_flags,
    add_run_args,
    finish_verb_parser,
    int_list,
    name_list,
    options_from_args,
    radius,
    share_arg,
    significance,
)
from robustest.cli.loading import check_fits, load_checked, load_model
from robustest.cli.output import log, out_dir, write_run, written
from robustest.cli.settings import data_settings, model_settings
from robustest.core.errors import ConfigError
from robustest.suite.build import BUILD_OPTIONS, build_suite
from robustest.suite.documents import SUITE_FILE

ORDER = 36


parse_drop = share_arg("a drop", "0.02 or 2%")  # --max-drop: "0.02" or "2%"


def add_parser(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser("suite", help="robustness regression gate: build a small stratified suite, check a candidate "
                                     "against its baseline", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="suite_command", metavar="COMMAND", parser_class=type(p))
    b = verbs.add_parser("build", help="draw K samples stratified by local robustness and store the baseline's "
                                       "outcomes", description=(__doc__ or "").split("\n\n")[1],
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(b)
    add_data_args(b, split="test")
    b.add_argument("--eps", type=radius, required=True, metavar="E",
                   help="radius of the threat model in pixel scale, e.g. 0.3 or 8/255 (L-inf: in (0, 1])")
    add_option_args(b, (build_suite, BUILD_OPTIONS), ("norm", "version", "n_targets", "corruptions"))
    b.add_argument("--severities", type=int_list(what="severity", lo=1, hi=5, sort=True), default=[1, 2, 3, 4, 5],
                   metavar="LIST", help="corruption severities: 1-5, 1,3,5 or 1-2,5 (default: 1-5)")
    add_option_args(b, (build_suite, BUILD_OPTIONS), ("certify", "k", "strata", "by_class", "allocation",
                                                      "n_neighbors", "noise_eps", "batch_size"))
    add_run_args(b)
    b.set_defaults(func=run_build)
    c = verbs.add_parser("check", help="check a candidate on a suite: estimate, paired comparison, verdict",
                         description="\n\n".join((__doc__ or "").split("\n\n")[2:4]),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--suite", required=True, metavar="FILE",
                   help="suite.pt written by 'robustest suite build' (or its --out folder)")
    add_model_args(c)
    c.add_argument("--baseline", default=None, metavar="FILE",
                   help="checkpoint of the baseline (default: the outcomes stored in the suite; a baseline with the "
                        "suite's weights reuses them)")
    c.add_argument("--no-baseline", action="store_true", help="only estimate; no comparison and no verdict")
    c.add_argument("--alpha", type=significance, default=0.05, metavar="A",
                   help="significance level of the exact McNemar test (default: 0.05)")
    c.add_argument("--max-drop", type=parse_drop, default=0.02, metavar="D",
                   help="largest tolerated drop of robust accuracy, 0.02 or 2%% (default: 0.02)")
    c.add_argument("--version", choices=("standard", "fast"), default=None,
                   help="attack ensemble (default: the suite's; another one re-evaluates the baseline, so it needs "
                        "--baseline)")
    c.add_argument("--accept-flag", type=name_list("flag"), default=None, metavar="LIST",
                   help="unreliable evaluation flags the gate accepts, by name (docs/EVAL.md)")
    c.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    c.add_argument("--device", default=None, metavar="D",
                   help="cpu, cuda, cuda:N or auto (default: the model's device, i.e. cpu)")
    add_output_flags(c)
    c.set_defaults(func=run_check)
    for q in (b, c):  # what the command gives every verb's own parser
        finish_verb_parser(q)
    p.set_defaults(func=_no_command)


def _no_command(args: argparse.Namespace) -> int:
    raise ConfigError("name a command: 'robustest suite build ...' or 'robustest suite check ...' (see --help)")


def _suite_path(text: str) -> Path:
    p = Path(text)
    return p / SUITE_FILE if p.is_dir() else p


# ------------------------------------------------------------------------------------------------- build
def run_build(args: argparse.Namespace) -> int:
    from robustest import corruptions
    from robustest.core.devices import model_device
    from robustest.core.validation import check_eps
    from robustest.suite.documents import build_results
    from robustest.suite.report import build_report

    t0 = time.perf_counter()
    check_eps("eps", args.eps, args.norm)
    if args.corruptions is not None:
        corruptions.resolve_names(args.corruptions)
    model, ds = load_checked(args)
    options = options_from_args((build_suite, BUILD_OPTIONS), args)
    suite = build_suite(model, ds, args.eps, **options, severities=args.severities, seed=args.seed,
                        dataset=args.dataset, split=args.split, progress=not args.no_progress)
    out = out_dir(args)
    suite.save(out / SUITE_FILE)
    settings: dict[str, Any] = {"command": "build", **model_settings(args), **data_settings(args), "eps": args.eps,
                                "norm": args.norm, "version": args.version, "k": args.k, "strata": args.strata,
                                "by_class": args.by_class, "allocation": args.allocation,
                                "neighbors": args.neighbors, "noise_eps": args.noise_eps,
                                "batch_size": args.batch_size, "seed": args.seed, "device": str(model_device(model))}
    if args.n_targets is not None:
        settings["n_targets"] = args.n_targets
    if args.corruptions is not None:
        settings.update(corruptions=args.corruptions, severities=list(args.severities))
    if args.certify is not None:
        settings["certify"] = args.certify
    doc = write_run(out, "suite", t0, settings, build_results(suite), suite.timings,
                    lambda doc: build_report(suite, doc))
    log.info(suite.summary_line())
    written(out, doc["files"], t0)
    return 0


# ------------------------------------------------------------------------------------------------- check
def run_check(args: argparse.Namespace) -> int:
    from robustest.core.devices import model_device
    from robustest.core.errors import EXIT_GATE
    from robustest.models.checkpoints import load_model as load_file
    from robustest.suite import Suite, check_suite
    from robustest.suite.documents import check_results
    from robustest.suite.report import check_report

    t0 = time.perf_counter()
    if args.no_baseline and args.baseline is not None:
        raise ConfigError("--no-baseline and --baseline exclude each other")
    path = _suite_path(args.suite)
    suite = Suite.load(path)
    stored = suite.meta["attack"]["version"]
    if args.version not in (None, stored) and args.baseline is None and not args.no_baseline:
        raise ConfigError(f"the suite's baseline outcomes were measured with --version {stored}: pass --baseline "
                          f"FILE to evaluate the baseline with {args.version} too, or --no-baseline")
    model = load_model(args)
    check_fits(model, (suite.images(), suite.y))
    baseline: Any = False if args.no_baseline else None
    if args.baseline is not None:
        baseline = load_file(args.baseline, torchscript=args.torchscript, map_location=model_device(model))
    res = check_suite(model, suite, baseline, alpha=args.alpha, max_drop=args.max_drop, version=args.version,
                      progress=not args.no_progress, accept_flags=args.accept_flag)
    out = out_dir(args)
    settings: dict[str, Any] = {"command": "check", "suite": str(path), **model_settings(args),
                                "alpha": args.alpha, "max_drop": args.max_drop, "version": res.version,
                                "device": str(model_device(model))}
    if args.baseline is not None:
        settings["baseline"] = args.baseline
    if args.no_baseline:
        settings["no_baseline"] = True
    if args.accept_flag:
        settings["accept_flag"] = list(res.accepted_flags)
    doc = write_run(out, "suite", t0, settings, check_results(res, suite), res.timings,
                    lambda doc: check_report(res, doc, suite))
    log.info(res.message())
    written(out, doc["files"], t0)
    from robustest.core.distributed import is_main

    if is_main():  # one line each, not one per rank
        for line in res.gate_lines():
            print(f"robustest suite: {line}", file=sys.stderr)
    return EXIT_GATE if res.failed else 0
