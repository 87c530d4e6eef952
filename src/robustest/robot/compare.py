"""The strategy comparison (:func:`compare`): one pool against the original model, the original model
fine-tuned once per (budget, strategy, seed) cell, and the aggregated table."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from robustest.errors import DataError
from robustest.robot.config import STRATEGIES, RobotConfig, derive_seed, parse_budget
from robustest.robot.pool import Pool, _coverage_profile, generate_pool, select_tests
from robustest.robot.report import RESULTS_FORMAT, RESULTS_VERSION, _write_outputs
from robustest.robot.setup import _f, _finetune, _last_figures, _log, _measure, _prepare_out, _quantiles, _rob, _setup
from robustest.robustness import RobustnessReport
from robustest.runtime import atomic_save, atomic_write_json


# ------------------------------------------------------------------------------------------- compare()
def compare(config: RobotConfig | dict[str, Any], model: nn.Module | None = None) -> dict[str, Any]:
    """Compare selection strategies on ONE pool generated against the original model.

    For every budget in ``config.budgets`` (default ``[config.budget]``), strategy in ``config.strategies``
    (default all of :data:`STRATEGIES`) and seed in ``config.seeds``, the ORIGINAL model is fine-tuned on
    the training data + the selected tests and measured. Writes results.json (with a per (strategy, budget)
    table of means and standard deviations), timings.json, summary.csv and report.html; returns results.
    """
    cfg = config if isinstance(config, RobotConfig) else RobotConfig.from_dict(config)
    if cfg.strategies is None:
        cfg.strategies = list(STRATEGIES)
    cfg.validate()
    out = _prepare_out(cfg, "compare")
    t_start = time.perf_counter()
    setup = _setup(cfg, out, model, "compare")
    state = out / "state"
    timings: dict[str, Any] = {"setup": setup.timings, "cells": []}
    budgets = cfg.budgets if cfg.budgets is not None else [cfg.budget]
    strategies = list(cfg.strategies)
    profile = None
    pool_path = state / "pool.pt"
    t0 = time.perf_counter()
    if pool_path.is_file():
        pool = Pool.from_payload(torch.load(pool_path, map_location="cpu", weights_only=True))
    else:
        _log(cfg, f"generating the {cfg.pool} pool from {len(setup.x_fit)} training images")
        if "coverage" in strategies or cfg.pool == "cov-fuzz":
            profile = _coverage_profile(setup.model0, setup.x_fit, cfg)
        pool = generate_pool(setup.model0, setup.x_fit, setup.y_fit, cfg, derive_seed(cfg.seed, "pool"),
                             profile=profile)
        atomic_save(pool.payload(), pool_path)
    timings["pool_s"] = time.perf_counter() - t0
    if len(pool) == 0:
        raise DataError("the test pool is empty (no successful attacks): raise eps or use another pool generator")
    _log(cfg, f"pool: {len(pool)} tests {pool.counts()}")
    cache: dict[str, Any] = {}
    cells: list[dict[str, Any]] = []
    selected_by_strategy: dict[str, torch.Tensor] = {}
    from robustest.runtime import progress as progress_bar

    plan = [(b, s, sd) for b in budgets for s in strategies for sd in cfg.seeds]
    for b, s, sd in progress_bar(plan, enabled=cfg.progress, desc="cells", unit="cell"):
        key = f"{s}_b{str(b).replace('%', 'pct')}_s{sd}"
        cdir = state / "cells" / key
        rec_path = cdir / "cell.json"
        n = parse_budget(b, len(pool))
        if rec_path.is_file():
            rec = json.loads(rec_path.read_text())
            idx = torch.load(cdir / "selected.pt", map_location="cpu", weights_only=True)["pool_index"]
        else:
            if profile is None and s == "coverage" and "bits" not in cache:
                profile = _coverage_profile(setup.model0, setup.x_fit, cfg)
            tc = time.perf_counter()
            cseed = derive_seed(cfg.seed, "cell", s, str(b), sd)
            idx = select_tests(s, setup.model0, pool, n, cfg, derive_seed(cseed, "select"), profile=profile,
                               cache=cache)
            sel = pool.subset(idx)
            new_model, last_model, tr = _finetune(setup.model0, setup, sel, cfg, derive_seed(cseed, "finetune"))
            rob = _measure(new_model, setup.test, setup.fixed, cfg, derive_seed(cfg.seed, "measure-cell", sd))
            last = _last_figures(rob, last_model, setup, cfg, derive_seed(cfg.seed, "measure-cell", sd))
            rec = {"strategy": s, "budget": b, "seed": sd, "n": len(sel), "by_method": sel.counts(),
                   "fol": _quantiles(sel.fol), "train": tr["history"], "robustness": _rob(rob),
                   "robustness_last_epoch": last}
            from robustest.checkpoints import save_weights

            save_weights(cdir / "model.pt", new_model, metadata={"strategy": s, "budget": str(b), "seed": sd})
            atomic_save({"pool_index": idx}, cdir / "selected.pt")
            atomic_write_json(rec_path, rec)  # written last: marks the cell finished
            timings["cells"].append({"cell": key, "seconds": time.perf_counter() - tc})
        if sd == cfg.seeds[0] and b == budgets[0]:
            selected_by_strategy[s] = idx
        cells.append(rec)
        rb = rec["robustness"]
        _log(cfg, f"{s:>8} budget {b} ({rec['n']}) seed {sd}: clean {_f(rb['clean_accuracy'])}, "
                  f"fixed-set {_f(rb['fixed_set_accuracy'])}, white-box {_f(rb['whitebox_accuracy'])}")
    table = comparison_table(cells, setup.baseline)
    results = {
        "format": RESULTS_FORMAT, "version": RESULTS_VERSION, "kind": "compare",
        "config": cfg.result_dict(), "data": setup.info, "baseline": _rob(setup.baseline),
        "pool": {"size": len(pool), "by_method": pool.counts(), "fol": _quantiles(pool.fol)},
        "cells": cells, "table": table,
    }
    timings["elapsed_s"] = time.perf_counter() - t_start
    examples = {s: pool.subset(i[: cfg.examples]) for s, i in selected_by_strategy.items()}
    _write_outputs(out, results, timings, setup, cfg, fol_by_round=None, examples=None,
                   compare_data={"pool": pool, "examples": examples, "selected": selected_by_strategy})
    return results


def comparison_table(cells: list[dict[str, Any]], baseline: RobustnessReport | dict[str, Any]
                     ) -> list[dict[str, Any]]:
    """Aggregate comparison cells into one row per (strategy, budget): mean and standard deviation over
    seeds of each robustness figure (``*_mean``/``*_std``), plus the original model's figures (``before_*``)."""
    base = baseline.to_dict() if isinstance(baseline, RobustnessReport) else baseline
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["strategy"], str(c["budget"])), []).append(c)
    rows = []
    for (s, b), cs in groups.items():
        row: dict[str, Any] = {"strategy": s, "budget": b, "n": cs[0]["n"], "seeds": len(cs)}
        for m in ("fixed_set_accuracy", "whitebox_accuracy", "clean_accuracy"):
            row[f"before_{m}"] = base.get(m)
            vals = [c["robustness"].get(m) for c in cs]
            vals = [v for v in vals if v is not None]
            row[f"{m}_mean"] = float(np.mean(vals)) if vals else None
            row[f"{m}_std"] = float(np.std(vals, ddof=1)) if len(vals) > 1 else (0.0 if vals else None)
        lv = [c["robustness_last_epoch"].get("fixed_set_accuracy") for c in cs]
        lv = [v for v in lv if v is not None]
        row["last_epoch_fixed_set_accuracy_mean"] = float(np.mean(lv)) if lv else None
        rows.append(row)
    return rows
