"""``robustest run``: the RobOT loop - generate tests, select them by FOL, fine-tune, measure robustness,
repeat until the robustness requirement is met, the FOL convergence rule fires, or rounds/time run out.

The default strategy is adv-train: every round fine-tunes by PGD adversarial training against the current
model (no pool, no selection), the strategy the measurements support (docs/RESULTS.md: no selection strategy
beats random selection, and at equal compute adversarial training raised white-box robustness far more
than the selection loop). ``--strategy random`` (or best, kmst, ...) runs the selection loop with ``--budget``.

Settings come from ``--config run.yaml`` (keys of robustest.robot.RobotConfig, see docs/RESULTS_SCHEMA.md)
and are overridden by the flags given. A config with ``strategies: [...]`` runs the strategy comparison
(as ``robustest compare``). Writes OUT/results.json (schema: docs/schemas/run.schema.json), OUT/summary.csv,
OUT/report.html, OUT/timings.json and the per-round state in OUT/state/; ``--resume`` continues an
interrupted run without redoing rounds.

Example:
    robustest run --checkpoint model.pt --dataset digits --eps 0.15 --rounds 3 --epochs 2 --out robot-out
    robustest run --checkpoint model.pt --dataset digits --eps 0.15 --strategy random --budget 5% \\
        --rounds 3 --epochs 5 --out robot-sel
"""

from __future__ import annotations

import argparse
from typing import Any

from robustest.cli.args import (
    json_object,
    learning_rate,
    linf_eps,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    seed_int,
    thread_count,
    unit_float,
)
from robustest.cli.output import log, print_table

ORDER = 40


def budget_arg(text: str) -> int | str:
    """A budget: a count (``100``) or a percentage of the pool (``5%``)."""
    from robustest.core.errors import ConfigError
    from robustest.robot import parse_budget

    value: int | str = int(text) if text.strip().isdigit() else text.strip()
    try:
        parse_budget(value, 100)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def add_common_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``run`` and ``compare`` (each overrides the config file's key of the same name)."""
    p.add_argument("--config", metavar="FILE", help="YAML file with RobotConfig keys (flags override it)")
    p.add_argument("--checkpoint", dest="model", metavar="FILE",
                   help="model.pt from 'robustest train', a .pt2 program, or a TorchScript archive with --torchscript "
                        "(default: train --train-model on the data first); with --model: that model's weights")
    p.add_argument("--torchscript", action="store_const", const=True,
                   help="accept a TorchScript archive as --checkpoint: it RUNS CODE from the file, so only from a "
                        "source you trust")
    p.add_argument("--model", dest="model_factory", metavar="PKG.MODULE:FACTORY",
                   help="build the model by calling your function or class (imported from PYTHONPATH or the "
                        "current folder): this RUNS YOUR CODE")
    p.add_argument("--model-args", type=json_object, metavar="JSON", help="keyword arguments for --model (JSON)")
    p.add_argument("--weights", metavar="FILE", help="state_dict for --model (torch.load weights_only=True)")
    p.add_argument("--train-model", metavar="NAME", help="zoo model trained when no checkpoint is given")
    p.add_argument("--train-epochs", type=positive_int, metavar="N", help="epochs for that training")
    p.add_argument("--dataset", metavar="NAME", help="data set name (default: digits)")
    p.add_argument("--data-dir", metavar="DIR", help="folder or file holding the data; not needed for digits")
    p.add_argument("--train-limit", type=positive_int, metavar="N", help="use only the first N training images")
    p.add_argument("--test-limit", type=positive_int, metavar="N", help="use only the first N test images")
    p.add_argument("--eps", type=linf_eps, help="L-inf radius in pixel scale (default: 0.3)")
    p.add_argument("--pool", choices=("attack", "fol-fuzz", "cov-fuzz"),
                   help="test generator: FGSM+PGD on the training set (default), FOL or coverage fuzzing")
    p.add_argument("--pool-limit", type=positive_int, metavar="N", help="generate tests from N training images")
    p.add_argument("--epochs", type=positive_int, help="fine-tuning epochs (default: 10)")
    p.add_argument("--batch-size", type=positive_int, help="fine-tuning batch size (default: 64)")
    p.add_argument("--lr", type=learning_rate, help="fine-tuning learning rate, Adam (default: 1e-3)")
    p.add_argument("--train-options", type=json_object, metavar="JSON",
                   help="training recipe of --train-model: options of robustest.train.fit plus lr and "
                        "batch_size, e.g. '{\"optimizer\": \"sgd\", \"lr\": 0.1, \"schedule\": \"cosine\"}'")
    p.add_argument("--finetune-options", type=json_object, metavar="JSON",
                   help="further fit options for fine-tuning, e.g. '{\"schedule\": \"step\", \"augment\": "
                        "\"crop-flip\"}'")
    p.add_argument("--whitebox-limit", type=positive_int, metavar="N",
                   help="white-box attacks on the first N test images (default: 1000)")
    p.add_argument("--no-whitebox", dest="whitebox", action="store_const", const=False,
                   help="skip the white-box measurement")
    p.add_argument("--autoattack", choices=("fast", "standard"),
                   help="also measure robust accuracy under the AutoAttack-style ensemble of 'robustest eval' on "
                        "the white-box images, in every measurement (fast: APGD-CE + APGD-T on 3 classes; "
                        "standard: AutoAttack's standard version); default: off")
    p.add_argument("--out", metavar="DIR", help="output folder (default: robot-out)")
    p.add_argument("--resume", action="store_const", const=True, help="continue the run saved in --out")
    p.add_argument("--seed", type=seed_int, help="random seed (default: 0)")
    p.add_argument("--device", metavar="D", help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--threads", type=thread_count, metavar="N",
                   help="CPU threads for torch (default: torch's choice; 1 is often faster for small models)")
    p.add_argument("--workers", type=non_negative_int, metavar="N",
                   help="worker processes decoding the data set when it is read (default: 0, the main process)")
    p.add_argument("--no-progress", action="store_true",
                   help="hide progress bars (they are off anyway when stderr is not a terminal)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="the RobOT loop: test, select by FOL, retrain, measure, until converged",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    from robustest.robot.config import strategies

    p.add_argument("--strategy", choices=strategies(),
                   help="strategy (default: adv-train: PGD adversarial training against the current model, no "
                        "pool); a selection strategy (random, best, ...) selects --budget tests from a fresh pool "
                        "every round; all: the whole pool every round; trades, fosc, fol-budget, fast-at: the other "
                        "methods of 'robustest harden', as adv-train")
    p.add_argument("--budget", type=budget_arg, help="tests selected per round: a count or '5%%' of the pool")
    p.add_argument("--rounds", type=positive_int, help="maximum number of rounds (default: 3)")
    p.add_argument("--time-budget", type=positive_float, metavar="SECONDS", help="stop starting rounds after this")
    p.add_argument("--target", type=unit_float, help="stop once --target-metric reaches this accuracy in [0, 1]")
    p.add_argument("--target-metric", choices=("clean_accuracy", "fixed_set_accuracy", "whitebox_accuracy",
                                               "whitebox_pgd_accuracy", "whitebox_apgd_accuracy",
                                               "autoattack_accuracy"),
                   help="robustness figure the requirement is on (default: whitebox_accuracy)")
    p.add_argument("--convergence-tol", type=non_negative_float,
                   help="relative change of the median FOL (default: 0.05)")
    p.add_argument("--convergence-patience", type=positive_int, help="rounds below the tolerance (default: 2)")
    p.set_defaults(func=run)


_FLAG_KEYS = ("model", "model_factory", "model_args", "weights", "torchscript", "train_model", "train_epochs",
              "dataset", "data_dir", "train_limit", "test_limit", "eps", "pool", "pool_limit", "epochs", "batch_size",
              "lr", "train_options", "finetune_options", "whitebox_limit", "whitebox", "autoattack", "out", "resume",
              "seed", "device", "workers", "strategy", "budget", "rounds", "time_budget", "target", "target_metric",
              "convergence_tol", "convergence_patience", "strategies", "budgets", "seeds")


def build_config(args: argparse.Namespace, defaults: dict[str, Any] | None = None):
    """RobotConfig from --config (if any), then ``defaults`` for keys the file does not set, then flags."""
    from robustest.robot import RobotConfig

    flags = {k: getattr(args, k, None) for k in _FLAG_KEYS}
    flags.update(progress=not args.no_progress, verbose=not getattr(args, "quiet", False))  # per-round lines
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    return RobotConfig.layered(args.config, defaults, flags)


def run(args: argparse.Namespace) -> int:
    from robustest import robot

    cfg = build_config(args)
    from robustest.robot.config import read_config

    budget_given = args.budget is not None or (args.config and "budget" in read_config(args.config))
    from robustest.robot.config import HARDEN_STRATEGIES

    if budget_given and cfg.strategies is None and cfg.strategy in HARDEN_STRATEGIES:
        from robustest.core.errors import ConfigError

        raise ConfigError(f"a budget selects tests from a pool, which strategy {cfg.strategy} (the default) does not "
                          "use: add --strategy random (or another selection strategy) to run the selection loop")
    results = robot.run(cfg)
    print_results(results, cfg.out)
    return 0


def print_results(results: dict[str, Any], out: str, file=None) -> None:
    """The results table and where the files went: to ``file`` when given, else through the ``robustest.cli``
    logger (stdout; nothing with --quiet)."""
    def say(text: str) -> None:
        if file is not None:
            print(text, file=file)
        else:
            log.info(text)

    from robustest.robot.tables import compare_table, loop_table, paired_table

    if results["kind"] == "loop":
        print_table(*loop_table(results), file=file)
        say(f"stopped: {results['stop_reason']} after {results['rounds_completed']} round(s)")
    else:
        print_table(*compare_table(results), file=file)
        paired = paired_table(results.get("paired_vs_random") or [])
        if paired is not None:
            heading, rows, cols = paired
            say(heading)
            print_table(rows, cols, file=file)
    say(f"wrote {out}/results.json, summary.csv, report.html")
