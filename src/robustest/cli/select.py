"""``robustest select``: choose a budget of inputs from a scored pool (output of 'robustest score').

Strategies: best (BE-ST: half lowest, half highest), kmst (KM-ST: equal random shares of k equal-width
score sections), top, bottom, random, coverage (greedy additional coverage; needs a scores.pt of a
coverage metric, which holds the covered cells), stratified, fol-prop, kcenter (k-center greedy, the core-set
selection, on the penultimate-layer features of a model: needs --tests and --checkpoint/--model; the scores
are only carried along). The budget is --n inputs or --fraction of the pool.

--scores takes the scores.pt written by 'robustest score' (or a scores.csv with an index,score header).
With --tests TESTS.pt (the tests file that was scored) the selected tests are also written as
OUT/selected_tests.pt in the same format, ready for retraining.

Writes to --out:
  selected.pt   dict of plain tensors: "indices" [n] int64 positions in the scored pool, "scores" [n], plus
                "strategy", "metric"
  selected.csv  rank,index,score
  results.json  settings in effect, pool and selection statistics, timings (schema:
                docs/schemas/select.schema.json)
  report.html   pool and selection statistics, score histograms, settings and timings
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import torch

from robustest import selection
from robustest.cli.args import add_model_args, add_output_flags, fraction, positive_int, seed_int
from robustest.cli.output import log, out_dir, write_run, written
from robustest.core.errors import ConfigError
from robustest.selection.score_reports import select_report
from robustest.selection.scores_file import read_scores

ORDER = 31


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("select", help="select a budget of inputs from scores (BE-ST, KM-ST, top, coverage, ...)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scores", required=True, metavar="FILE", help="scores.pt (or scores.csv) from 'robustest score'")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--n", type=positive_int, metavar="N", help="number of inputs to select (at least 1)")
    budget.add_argument("--fraction", type=fraction, metavar="F", help="fraction of the pool to select (0, 1]")
    p.add_argument("--strategy", required=True, choices=selection.names(),
                   help="; ".join(selection.describe(s) for s in selection.names()))
    p.add_argument("--k", type=positive_int, default=4,
                   help="KM-ST sections, or stratified's score-quantile bins (default: 4)")
    p.add_argument("--fill", choices=("total", "random"), default="total",
                   help="coverage: how to complete once no input adds coverage (default: total)")
    p.add_argument("--tests", metavar="FILE", default=None,
                   help="the tests file that was scored: also write the selected tests to OUT/selected_tests.pt")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    p.add_argument("--seed", type=seed_int, default=0,
                   help="random seed of random, kmst, stratified, fol-prop and kcenter's first centre (default: 0)")
    p.add_argument("--device", default=None, metavar="D",
                   help="kcenter: where the features are computed and the greedy runs: cpu, cuda, cuda:N or auto "
                        "(default: cpu)")
    add_model_args(p)
    add_output_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from robustest.selection.select_pipeline import read_scored_tests, select_pipeline, strategy_input

    t0 = time.perf_counter()
    data = read_scores(args.scores)
    pool = len(data["scores"])
    spec = selection.get(args.strategy)
    _check_model_flags(args, spec)
    tests = read_scored_tests(args.tests, data["index"]) if args.tests is not None else None
    source = strategy_input(data, args.strategy, _features(args, tests) if spec.needs == "features" and tests
                            is not None else None)  # refused here, before any file is written
    n = args.n if args.n is not None else int(math.ceil(args.fraction * pool))
    out = out_dir(args)
    srun = select_pipeline(data, args.strategy, n, out=out, source=source, k=args.k, seed=args.seed, fill=args.fill,
                           tests=tests)
    for note in srun.warnings:
        log.warning(note)
    settings: dict[str, Any] = {"scores": str(args.scores), "strategy": args.strategy,
                                **({"n": args.n} if args.n is not None else {"fraction": args.fraction}),
                                **srun.settings}
    if spec.needs == "features":
        settings["model"] = args.checkpoint or args.model_factory or args.weights
    if args.tests is not None:
        settings["tests"] = str(args.tests)
    results = srun.to_results()
    write_run(out, "select", t0, settings, results, {}, lambda doc: select_report(doc, data["scores"], srun.chosen))
    log.info(srun.summary_line(args.strategy))
    written(out, results["files"], t0)
    return 0


def _check_model_flags(args: argparse.Namespace, spec: selection.Strategy) -> None:
    """Refuse model flags for a strategy that needs no features (only kcenter's kind reads the model)."""
    given = [f for f, v in (("--checkpoint", args.checkpoint), ("--model", args.model_factory),
                            ("--weights", args.weights), ("--model-args", args.model_args),
                            ("--torchscript", args.torchscript or None), ("--device", args.device)) if v is not None]
    if given and spec.needs != "features":
        takers = " or ".join(s for s in selection.names() if selection.get(s).needs == "features")
        raise ConfigError(f"{given[0]} applies to --strategy {takers} only (the model's features): drop it")


def _features(args: argparse.Namespace, tests: dict[str, Any]) -> torch.Tensor:
    """Penultimate-layer features [N, D] of the scored tests (in the scores' order), on the model's device."""
    from robustest.cli.loading import check_fits, load_model
    from robustest.metrics.activations import penultimate_features

    model = load_model(args)
    x = tests["scored_x"]
    check_fits(model, (x, tests["scored_y"]))
    return penultimate_features(model, x)
