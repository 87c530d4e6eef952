"""The RobOT loop: generate tests -> score them by FOL -> select a budget -> fine-tune -> measure
robustness -> decide whether robustness has converged (METHODS.md A4).

Two entry points, both driven by a :class:`RobotConfig` (a dataclass, loadable from YAML or a dict):

* :func:`run` - the iterative loop. Round r generates a pool of tests against the current model
  (FGSM + PGD on the training set as in the paper, FOL-guided fuzzing or coverage-guided fuzzing), scores
  it by FOL, selects ``budget`` tests with ``strategy``, fine-tunes the current model on the training data
  plus every test selected so far, and measures robustness. It stops when the robustness requirement is
  met, when the FOL convergence rule fires, or when the rounds or the time budget run out.
* :func:`compare` - the honest strategy comparison: ONE pool generated against the original model, and
  the original model fine-tuned once per (budget, strategy, seed) cell.

Robustness is measured with :func:`robustest.evaluate.measure`: clean accuracy, accuracy on the fixed
adversarial set (successful FGSM/PGD examples of the test split against the ORIGINAL model; the paper's
measure, 0 % for the original model) and white-box accuracy of the current model (PGD with restarts and
APGD-CE). Fine-tuning picks its checkpoint on a validation split carved from the training data (clean
validation images plus their FGSM/PGD examples against the original model), never on an evaluation set;
the last epoch's clean and fixed-set figures are reported too.

FOL convergence rule. After every round (and for the original model, round 0) fresh PGD tests are
generated against the current model from ``convergence_probe`` training images (10 steps of eps/6,
random start) and their FOL values computed; the statistic is the median FOL m_r. The relative change
``|m_r - m_{r-1}| / |m_{r-1}|`` is recorded every round; the rule fires when it stays below
``convergence_tol`` for ``convergence_patience`` consecutive rounds.

Resume. Every round (every comparison cell) writes its state atomically under ``OUT/state/``: the model
checkpoint, the selected tests with their pool indices, and a JSON record written last. With
``resume=True`` finished rounds/cells are loaded instead of recomputed. Every unit of work is seeded from
(seed, round or cell, purpose), so a resumed run writes the same ``results.json`` as an uninterrupted one;
wall-clock timings live in ``timings.json``.

Package layout: ``config`` (RobotConfig, parse_budget), ``pool`` (Pool, generate_pool,
select_tests), ``setup`` (what run and compare share: output folder and resume marker, data, original model,
fixed set and baseline, fine-tuning, measurement), ``loop`` (run, the rounds, the convergence rule),
``compare`` (compare, comparison_table, paired_vs_random), ``compute`` (cell_compute: a cell's compute record,
in the passes :class:`robustest.core.compute.PassCounter` measures), ``report`` (results.json, timings.json,
summary.csv, report.html).
"""

from __future__ import annotations

from robustest.robot.compare import compare, comparison_table, paired_vs_random
from robustest.robot.config import (
    BUDGET_FREE,
    DEFAULT_STRATEGIES,
    METRICS,
    POOLS,
    RobotConfig,
    parse_budget,
    selection_strategies,
    strategies,
)
from robustest.robot.loop import convergence_update, run
from robustest.robot.pool import Pool, generate_pool, select_tests
from robustest.robot.report import RESULTS_FORMAT, RESULTS_VERSION

__all__ = [
    "BUDGET_FREE",
    "DEFAULT_STRATEGIES",
    "METRICS",
    "POOLS",
    "RESULTS_FORMAT",
    "RESULTS_VERSION",
    "Pool",
    "RobotConfig",
    "compare",
    "comparison_table",
    "convergence_update",
    "generate_pool",
    "paired_vs_random",
    "parse_budget",
    "run",
    "select_tests",
    "selection_strategies",
    "strategies",
]
