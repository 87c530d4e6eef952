"""``robustest compare``: compare test-selection strategies honestly - ONE pool of tests generated against
the original model, and the original model fine-tuned once per (budget, strategy, seed); a table of
robustness (fixed adversarial set and white-box) per strategy and budget with mean and spread over seeds.

Settings as for ``robustest run`` (``--config`` YAML, flags override). Lists are comma-separated; seeds and
counts also take ranges (``--seeds 0-4``). Writes OUT/results.json (schema: docs/schemas/compare.schema.json),
OUT/summary.csv (the table), OUT/report.html, OUT/timings.json and per-cell state in OUT/state/cells/;
``--resume`` continues without redoing finished cells.

Example:
    robustest compare --checkpoint model.pt --dataset digits --eps 0.15 --budgets 5%,10% \\
        --strategies best,kmst,gini,random --seeds 0,1,2 --epochs 5 --out compare-out
"""

from __future__ import annotations

import argparse
import time

from robustest.cli.args import list_arg, seed_int
from robustest.cli.run import add_common_args, budget_arg, build_config, print_results

ORDER = 41


def _strategy(text: str) -> str:
    from robustest.robot import strategies

    known = strategies()
    if text not in known:
        raise argparse.ArgumentTypeError(f"unknown strategy {text!r}: choose from {', '.join(known)}")
    return text


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare selection strategies on one pool (robustness per strategy/budget)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--strategies", type=list_arg(_strategy, what="strategy"), metavar="LIST",
                   help="comma-separated strategies: best, kmst, gini, random, coverage, stratified (FOL quantile x "
                        "class), fol-prop (probability proportional to FOL), kcenter (k-center greedy on "
                        "penultimate-layer features), and the baselines all (the whole pool) and adv-train (PGD "
                        "adversarial training against the current model, no pool; run once per seed) "
                        "(default: best,kmst,gini,random,coverage)")
    p.add_argument("--budgets", type=list_arg(budget_arg, ranges=True, what="budget"), metavar="LIST",
                   help="comma-separated budgets: counts (ranges too, 10-12) or percentages of the pool (default: 5%%)")
    p.add_argument("--seeds", type=list_arg(seed_int, ranges=True, what="seed", lo=0, hi=2**63 - 1), metavar="LIST",
                   help="seeds: 0,1,2 or a range 0-4 (default: 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from robustest import robot

    t0 = time.perf_counter()
    cfg = build_config(args, defaults={"strategies": list(robot.DEFAULT_STRATEGIES)})
    results = robot.compare(cfg)
    print_results(results, cfg.out, t0)
    return 0
