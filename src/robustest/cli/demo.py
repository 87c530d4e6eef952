"""``robustest demo``: the main job of robustest on the built-in digits data, needing no files.

Trains ``digits_cnn`` on digits (8x8), generates one pool of FGSM + PGD tests (eps 0.15) on the training
set, retrains the model per selection strategy (best, kmst, gini, random, coverage) and seed (3) with 10 % of the
pool, and, side by side, fine-tunes it by adversarial training against the model as it learns (adv-train:
PGD-AT; fol-budget: PGD that stops per sample once its FOL is small; no pool, see docs/HARDEN.md), then
prints every strategy's robustness before and after retraining, and each one's paired difference to random
selection with its 95 % interval and a verdict in words (better or worse than random on which figures, or
not distinguishable from it): accuracy on the fixed
adversarial set (successful attacks on the test split against the original model, so 0 before) and
white-box accuracy (PGD with restarts + APGD-CE against the retrained model itself). Writes the report to
./robustest-demo/ (or --out): results.json (the comparison's results, schema
docs/schemas/compare.schema.json), summary.csv and report.html. Takes about two minutes on one CPU core
(single-threaded by default).
Running it again with the same --out reuses the finished work saved there (an interrupted demo continues
where it stopped).
"""

from __future__ import annotations

import argparse
import time

from robustest.cli.args import seed_int, thread_count
from robustest.cli.output import fmt, log

ORDER = 5

DEMO_SETTINGS = {
    "dataset": "digits", "train_model": "digits_cnn", "train_epochs": 20, "eps": 0.15, "pool": "attack",
    "strategies": ["best", "kmst", "gini", "random", "coverage", "adv-train", "fol-budget"], "budgets": ["10%"],
    "seeds": [0, 1, 2],
    "epochs": 5, "batch_size": 64, "lr": 1e-3, "whitebox_limit": None, "whitebox_pgd_steps": 10,
    "whitebox_restarts": 2, "apgd_steps": 20, "convergence_probe": 200, "coverage_metric": "kmnc",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train a digits model, compare the selection strategies and adversarial "
                                    "training, write a report",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="robustest-demo", metavar="DIR",
                   help="output folder (default: ./robustest-demo)")
    p.add_argument("--seed", type=seed_int, default=0, help="random seed (default: 0)")
    p.add_argument("--threads", type=thread_count, default=1, metavar="N",
                   help="CPU threads for torch (default: 1; the demo's models are too small to gain from more, "
                        "and extra threads slow down sharply when the cores are busy)")
    p.add_argument("--autoattack", choices=("fast", "standard"), default=None,
                   help="also measure every model's robust accuracy under robustest eval's AutoAttack-style ensemble "
                        "(fast: APGD-CE + APGD-T; standard: + FAB-T + Square), an AutoAttack column in the tables "
                        "(default: off; fast adds about a minute)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from robustest import robot
    from robustest.cli.run import print_results

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    cfg = robot.RobotConfig.from_dict({**DEMO_SETTINGS, "out": args.out, "seed": args.seed, "resume": True,
                                       "progress": not args.no_progress, "verbose": not args.quiet,
                                       **({"autoattack": args.autoattack} if args.autoattack else {})})
    results = robot.compare(cfg)
    log.info(f"robustest demo: {cfg.train_model} on digits, eps {fmt(cfg.eps)}, pool of {results['pool']['size']} "
             f"FGSM/PGD tests, budget {cfg.budgets[0]}, {cfg.epochs} fine-tuning epochs per strategy and seed "
             f"(mean ± std over seeds {', '.join(map(str, cfg.seeds))})")
    print_results(results, cfg.out, t0)
    log.info(f"open {cfg.out}/report.html ({fmt(time.perf_counter() - t0, 'total_s')} s)")
    return 0
