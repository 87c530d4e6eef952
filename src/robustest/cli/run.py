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
import time
from pathlib import Path
from typing import Any

from robustest.cli.args import add_option_args, options_from_args, thread_count
from robustest.cli.output import log, print_table, written

ORDER = 40
#: the files of a run's or a comparison's folder the closing line names (the state of each round goes to OUT/state)
RUN_FILES = ("results.json", "summary.csv", "report.html")


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


#: the RobotConfig keys both verbs offer as flags, in the order of the help; run adds RUN_KEYS
COMMON_KEYS = ("model", "torchscript", "model_factory", "model_args", "weights", "train_model", "train_epochs",
               "dataset", "data_dir", "train_limit", "test_limit", "eps", "pool", "pool_limit", "epochs", "batch_size",
               "lr", "train_options", "finetune_options", "whitebox_limit", "whitebox", "autoattack", "out", "resume",
               "seed", "device", "workers")
RUN_KEYS = ("strategy", "rounds", "time_budget", "target", "target_metric", "convergence_tol", "convergence_patience")


def add_common_args(p: argparse.ArgumentParser, keys: tuple[str, ...] = ()) -> None:
    """--config and the flags of the RobotConfig keys ``COMMON_KEYS + keys``, generated from its fields (each
    overrides the config file's key of the same name; a flag not given is None, so the file's value stays)."""
    from robustest.robot import RobotConfig

    p.add_argument("--config", metavar="FILE", help="YAML file with RobotConfig keys (flags override it)")
    add_option_args(p, RobotConfig, COMMON_KEYS + keys, unset=True)
    p.set_defaults(config_keys=COMMON_KEYS + keys)
    p.add_argument("--threads", type=thread_count, metavar="N",
                   help="CPU threads for torch (default: torch's choice; 1 is often faster for small models)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="the RobOT loop: test, select by FOL, retrain, measure, until converged",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, RUN_KEYS)
    p.add_argument("--budget", type=budget_arg, help="tests selected per round: a count or '5%%' of the pool")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace, defaults: dict[str, Any] | None = None,
                 file: dict[str, Any] | None = None):
    """RobotConfig from --config (if any; ``file``: its content, already read), then ``defaults`` for keys the file
    does not set, then flags."""
    from robustest.robot import RobotConfig

    flags = {**options_from_args(RobotConfig, args, args.config_keys),
             **{k: getattr(args, k, None) for k in ("budget", "strategies", "budgets", "seeds")}}
    flags.update(progress=not args.no_progress, verbose=not getattr(args, "quiet", False))  # per-round lines
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    return RobotConfig.layered(file if file is not None else args.config, defaults, flags)


def run(args: argparse.Namespace) -> int:
    from robustest import robot
    from robustest.robot.config import HARDEN_STRATEGIES, read_config

    file = read_config(args.config) if args.config else None  # read once: the config and whether it sets budget
    t0 = time.perf_counter()
    cfg = build_config(args, file=file)
    budget_given = args.budget is not None or "budget" in (file or {})
    if budget_given and cfg.strategies is None and cfg.strategy in HARDEN_STRATEGIES:
        from robustest.core.errors import ConfigError

        raise ConfigError(f"a budget selects tests from a pool, which strategy {cfg.strategy} (the default) does not "
                          "use: add --strategy random (or another selection strategy) to run the selection loop")
    results = robot.run(cfg)
    print_results(results, cfg.out, t0)
    return 0


def print_results(results: dict[str, Any], out: str, started: float) -> None:
    """The results table and the closing line (:func:`robustest.cli.output.written`, timed from ``started``, a
    :func:`time.perf_counter` reading), through the ``robustest.cli`` logger (stdout; nothing with --quiet)."""
    from robustest.robot.tables import compare_table, loop_table, paired_table

    if results["kind"] == "loop":
        print_table(*loop_table(results))
        log.info(f"stopped: {results['stop_reason']} after {results['rounds_completed']} round(s)")
    else:
        print_table(*compare_table(results))
        paired = paired_table(results.get("paired_vs_random") or [])
        if paired is not None:
            heading, rows, cols = paired
            log.info(heading)
            print_table(rows, cols)
    written(Path(out), RUN_FILES, started)
