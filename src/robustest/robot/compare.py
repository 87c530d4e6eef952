"""The strategy comparison (:func:`compare`): one pool against the original model, the original model
fine-tuned once per (budget, strategy, seed) cell, and the aggregated table."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from robustest.core import distributed
from robustest.core.atomic import atomic_save, atomic_write_json
from robustest.core.compute import PassCounter
from robustest.core.errors import ConfigError, DataError
from robustest.core.progress import progress as progress_bar
from robustest.core.seeding import derive_seed
from robustest.evaluate import RobustnessReport
from robustest.models.checkpoints import clone_model, save_weights
from robustest.robot.compute import cell_compute
from robustest.robot.config import (
    BUDGET_FREE,
    DEFAULT_STRATEGIES,
    HARDEN_STRATEGIES,
    RobotConfig,
    parse_budget,
)
from robustest.robot.pool import Pool, coverage_profile_of, generate_pool, select_tests
from robustest.robot.report import RESULTS_FORMAT, RESULTS_VERSION, write_outputs
from robustest.robot.setup import (
    RunSetup,
    adversarial_finetune,
    finetune_on_tests,
    fmt_acc,
    last_figures,
    log_progress,
    measure_model,
    prepare_out,
    prepare_setup,
    quantiles,
    robustness_figures,
)

#: the figures paired_vs_random compares (autoattack_accuracy only where it was measured: config ``autoattack``)
PAIRED_METRICS = ("fixed_set_accuracy", "whitebox_accuracy", "clean_accuracy", "autoattack_accuracy")


# ------------------------------------------------------------------------------------------- compare()
def compare(config: RobotConfig | dict[str, Any], model: nn.Module | None = None) -> dict[str, Any]:
    """Compare selection strategies on ONE pool generated against the original model.

    For every budget in ``config.budgets`` (default ``[config.budget]``), strategy in ``config.strategies``
    (default :data:`DEFAULT_STRATEGIES`) and seed in ``config.seeds``, the ORIGINAL model is fine-tuned on
    the training data + the selected tests and measured. The budget-free baselines (``all``: the whole pool;
    ``adv-train``: PGD adversarial training, no pool) run once per seed, under the budget label of
    :data:`BUDGET_FREE`. Every cell records its compute in forward+backward passes (pool generation, selection
    scoring, fine-tuning, adversarial generation). Writes results.json (a per (strategy, budget) table of means
    and standard deviations, and :func:`paired_vs_random`), timings.json, summary.csv and report.html; returns
    the results.
    """
    cfg = config if isinstance(config, RobotConfig) else RobotConfig.from_dict(config)
    if cfg.strategies is None:
        cfg.strategies = list(DEFAULT_STRATEGIES)
    cfg.validate()
    out = prepare_out(cfg, "compare")
    t_start = time.perf_counter()
    setup = prepare_setup(cfg, out, model, "compare")
    state = out / "state"
    timings: dict[str, Any] = {"setup": setup.timings, "cells": []}
    budgets = cfg.budgets if cfg.budgets is not None else [cfg.budget]
    strategies = list(cfg.strategies)
    t0 = time.perf_counter()
    pool, pool_cost, profile = _load_or_generate_pool(cfg, setup, strategies, state)
    timings["pool_s"] = time.perf_counter() - t0
    if len(pool) == 0:
        raise DataError("the test pool is empty (no successful attacks): raise eps or use another pool generator")
    log_progress(cfg, f"pool: {len(pool)} tests {pool.counts()}")
    cache: dict[str, Any] = {}
    generation = _pool_passes(cfg, pool_cost, profile, cache)
    plan = [(b, s, sd) for b in budgets for s in strategies if s not in BUDGET_FREE for sd in cfg.seeds]
    plan += [(BUDGET_FREE[s], s, sd) for s in strategies if s in BUDGET_FREE for sd in cfg.seeds]
    keys = [_cell_key(b, s, sd) for b, s, sd in plan]
    ctx = {"setup": setup, "pool": pool, "cfg": cfg, "cache": cache, "profile": profile,
           "generation": generation}
    fresh = _run_cells(ctx, plan, keys, state, timings["cells"])
    cells, selected_by_strategy = _gather_cells(cfg, plan, keys, fresh, state, budgets)
    table = comparison_table(cells, setup.baseline)
    results = {
        "format": RESULTS_FORMAT, "version": RESULTS_VERSION, "kind": "compare",
        "config": cfg.result_dict(), "data": setup.info, "baseline": robustness_figures(setup.baseline),
        "pool": {"size": len(pool), "by_method": pool.counts(), "fol": quantiles(pool.fol),
                 "compute": {"generation": generation, "fol_scoring": pool_cost.get("fol_scoring"),
                             "coverage_profile": pool_cost.get("profile") if cfg.pool != "cov-fuzz" else None}},
        "cells": cells, "table": table, "paired_vs_random": paired_vs_random(cells),
    }
    timings["elapsed_s"] = time.perf_counter() - t_start
    examples = {s: pool.subset(i[: cfg.examples]) for s, i in selected_by_strategy.items()}
    write_outputs(out, results, timings, setup, cfg, fol_by_round=None, examples=None,
                   compare_data={"pool": pool, "examples": examples, "selected": selected_by_strategy})
    return results


def _load_or_generate_pool(cfg: RobotConfig, setup: RunSetup, strategies: list[str], state: Path
                           ) -> tuple[Pool, dict[str, Any], Any]:
    """The comparison's one pool -> (pool, its compute in passes, the coverage profile or None): read from
    ``state`` when an earlier run saved it, else generated against the original model (with the coverage profile
    first when a strategy or the pool needs it) and saved."""
    pool_path = state / "pool.pt"
    cost_path = state / "pool_compute.json"
    profile = None
    if pool_path.is_file():
        pool = Pool.from_payload(torch.load(pool_path, map_location="cpu", weights_only=True))
        pool_cost = json.loads(cost_path.read_text()) if cost_path.is_file() else \
            {"generation": None, "fol_scoring": None, "profile": None}
        return pool, pool_cost, profile
    log_progress(cfg, f"generating the {cfg.pool} pool from {len(setup.x_fit)} training images")
    pool_cost = {"profile": None}
    if "coverage" in strategies or cfg.pool == "cov-fuzz":
        with PassCounter(setup.model0) as pc:
            profile = coverage_profile_of(setup.model0, setup.x_fit, cfg)
        pool_cost["profile"] = pc.passes
    pool = generate_pool(setup.model0, setup.x_fit, setup.y_fit, cfg, derive_seed(cfg.seed, "pool"),
                         profile=profile, compute=pool_cost)
    atomic_save(pool.payload(), pool_path)
    atomic_write_json(cost_path, pool_cost)
    return pool, pool_cost, profile


def _pool_passes(cfg: RobotConfig, pool_cost: dict[str, Any], profile: Any, cache: dict[str, Any]) -> Any:
    """The passes every cell is charged for generating the pool (the fuzzer's coverage profile included: it is
    part of generating); the profile's and the FOL scoring's passes go to ``cache`` for the strategies that
    use them."""
    generation = pool_cost.get("generation")
    if cfg.pool == "cov-fuzz" and generation is not None:  # the fuzzer needs the profile: part of generating
        generation = None if pool_cost.get("profile") is None else generation + pool_cost["profile"]
    elif profile is not None:
        cache["profile_passes"] = pool_cost.get("profile")
    cache["fol_passes"] = pool_cost.get("fol_scoring")
    return generation


def _run_cells(ctx: dict[str, Any], plan: list[tuple[Any, str, int]], keys: list[str], state: Path,
               cell_timings: list[dict[str, Any]]) -> dict[int, tuple[dict[str, Any], torch.Tensor]]:
    """Run the cells of ``plan`` not finished under ``state`` and save each (rank 0 writes) -> {plan position:
    (cell record, selected pool indices)}; each cell's seconds are appended to ``cell_timings``."""
    todo = [i for i, k in enumerate(keys) if not (state / "cells" / k / "cell.json").is_file()]
    world, me = distributed.world_size(), distributed.rank()
    if world > 1:  # rank 0's view of the finished cells decides the rounds for every rank
        todo = distributed.broadcast(todo)
    fresh: dict[int, tuple[dict[str, Any], torch.Tensor]] = {}
    # Whole cells per rank: under torchrun rank r fine-tunes and measures cells r, r + W, ... by itself
    # (local_work: no collectives inside a cell), then the W cells of a round go to rank 0, which writes them.
    # Every cell is seeded by its (strategy, budget, seed), so the files equal one process's.
    for start in progress_bar(range(0, len(todo), world), enabled=ctx["cfg"].progress, desc="cells",
                              unit=f"{world} cells" if world > 1 else "cell"):
        mine = todo[start + me] if start + me < len(todo) else None
        done: dict[str, Any] | None = None
        if mine is not None:
            with distributed.local_work():
                done = _run_cell(ctx, *plan[mine])
            done["i"] = mine
        for res in (distributed.all_gather_objects(done) if world > 1 else [done]):
            if res is None:
                continue
            _save_cell(state / "cells" / keys[res["i"]], ctx["setup"].model0, plan[res["i"]], res)
            cell_timings.append({"cell": keys[res["i"]], "seconds": res["seconds"]})
            fresh[res["i"]] = (res["rec"], res["idx"])
    return fresh


def _save_cell(cdir: Path, model0: nn.Module, cell: tuple[Any, str, int], res: dict[str, Any]) -> None:
    """Write a finished cell under ``cdir``: its weights (``res["state"]``, popped), its selected pool indices and
    its record, written last as the mark that the cell is finished."""
    b, s, sd = cell
    weights = clone_model(model0).cpu()
    weights.load_state_dict(res.pop("state"))
    save_weights(cdir / "model.pt", weights, metadata={"strategy": s, "budget": str(b), "seed": sd})
    atomic_save({"pool_index": res["idx"]}, cdir / "selected.pt")
    atomic_write_json(cdir / "cell.json", res["rec"])  # written last: marks the cell finished


def _gather_cells(cfg: RobotConfig, plan: list[tuple[Any, str, int]], keys: list[str],
                  fresh: dict[int, tuple[dict[str, Any], torch.Tensor]], state: Path, budgets: list[Any]
                  ) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    """Every cell's record in plan order (run now, or read from ``state``: finished by an earlier run), each
    logged -> (records, the pool indices each strategy selected at the first budget and seed)."""
    cells: list[dict[str, Any]] = []
    selected_by_strategy: dict[str, torch.Tensor] = {}
    for i, ((b, s, sd), key) in enumerate(zip(plan, keys)):
        if i in fresh:
            rec, idx = fresh[i]
        else:  # finished by an earlier run
            cdir = state / "cells" / key
            rec = json.loads((cdir / "cell.json").read_text())
            idx = torch.load(cdir / "selected.pt", map_location="cpu", weights_only=True)["pool_index"]
        if sd == cfg.seeds[0] and (b == budgets[0] or s == "all"):
            selected_by_strategy[s] = idx
        cells.append(rec)
        rb = rec["robustness"]
        aa = f", AutoAttack {fmt_acc(rb['autoattack_accuracy'])}" if rb.get("autoattack_accuracy") is not None else ""
        log_progress(cfg, f"{s:>8} budget {b} ({rec['n']}) seed {sd}: clean {fmt_acc(rb['clean_accuracy'])}, "
                          f"fixed-set {fmt_acc(rb['fixed_set_accuracy'])}, "
                          f"white-box {fmt_acc(rb['whitebox_accuracy'])}{aa}")
    return cells, selected_by_strategy


def _cell_key(b: Any, s: str, sd: int) -> str:
    return f"{s}_s{sd}" if s in BUDGET_FREE else f"{s}_b{str(b).replace('%', 'pct')}_s{sd}"


def _run_cell(ctx: dict[str, Any], b: Any, s: str, sd: int) -> dict[str, Any]:
    """Fine-tune the original model for one (budget, strategy, seed) cell and measure it: the cell record,
    the selected pool indices, the weights (CPU state dict) and the seconds it took."""
    setup, pool, cfg, cache = ctx["setup"], ctx["pool"], ctx["cfg"], ctx["cache"]
    n = 0 if s in HARDEN_STRATEGIES else parse_budget(b, len(pool))
    if ctx["profile"] is None and s == "coverage" and "bits" not in cache:
        with PassCounter(setup.model0) as pc:
            ctx["profile"] = coverage_profile_of(setup.model0, setup.x_fit, cfg)
        cache["profile_passes"] = pc.passes
    tc = time.perf_counter()
    cseed = derive_seed(cfg.seed, "cell", s, str(b), sd)
    sel_cost: dict[str, Any] = {"selection_scoring": 0.0}
    if s in HARDEN_STRATEGIES:
        idx = torch.zeros(0, dtype=torch.long)
        new_model, last_model, tr = adversarial_finetune(setup.model0, setup, cfg, derive_seed(cseed, "finetune"),
                                                  method=HARDEN_STRATEGIES[s])
    else:
        idx = select_tests(s, setup.model0, pool, n, cfg, derive_seed(cseed, "select"), profile=ctx["profile"],
                           cache=cache, compute=sel_cost)
        new_model, last_model, tr = finetune_on_tests(setup.model0, setup, pool.subset(idx), cfg,
                                              derive_seed(cseed, "finetune"))
    sel = pool.subset(idx)
    rob = measure_model(new_model, setup.test, setup.fixed, cfg, derive_seed(cfg.seed, "measure-cell", sd))
    last = last_figures(rob, last_model, setup, cfg, derive_seed(cfg.seed, "measure-cell", sd))
    compute = cell_compute(pool_generation=0.0 if s in HARDEN_STRATEGIES else ctx["generation"],
                           selection_scoring=sel_cost["selection_scoring"], finetune=tr["passes"],
                           adversarial=tr["adversarial_passes"])
    rec = {"strategy": s, "budget": b, "seed": sd, "n": len(sel), "by_method": sel.counts(),
           "fol": quantiles(sel.fol), "train": tr["history"], "robustness": robustness_figures(rob),
           "robustness_last_epoch": last, "compute": compute}
    return {"rec": rec, "idx": idx, "state": {k: v.detach().cpu() for k, v in new_model.state_dict().items()},
            "seconds": time.perf_counter() - tc}


def comparison_table(cells: list[dict[str, Any]], baseline: RobustnessReport | dict[str, Any]
                     ) -> list[dict[str, Any]]:
    """Aggregate comparison cells into one row per (strategy, budget): mean and standard deviation over
    seeds of each robustness figure (``*_mean``/``*_std``), plus the original model's figures (``before_*``).
    ``autoattack_accuracy`` gets its three columns only when some cell measured it (config ``autoattack``)."""
    base = baseline.to_dict() if isinstance(baseline, RobustnessReport) else baseline
    metrics = ["fixed_set_accuracy", "whitebox_accuracy", "clean_accuracy"]
    if any(c["robustness"].get("autoattack_accuracy") is not None for c in cells):
        metrics.append("autoattack_accuracy")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["strategy"], str(c["budget"])), []).append(c)
    rows = []
    for (s, b), cs in groups.items():
        row: dict[str, Any] = {"strategy": s, "budget": b, "n": cs[0]["n"], "seeds": len(cs)}
        for m in metrics:
            row[f"before_{m}"] = base.get(m)
            vals = [c["robustness"].get(m) for c in cs]
            vals = [v for v in vals if v is not None]
            row[f"{m}_mean"] = float(np.mean(vals)) if vals else None
            row[f"{m}_std"] = float(np.std(vals, ddof=1)) if len(vals) > 1 else (0.0 if vals else None)
        lv = [c["robustness_last_epoch"].get("fixed_set_accuracy") for c in cs]
        lv = [v for v in lv if v is not None]
        row["last_epoch_fixed_set_accuracy_mean"] = float(np.mean(lv)) if lv else None
        cv = [(c.get("compute") or {}).get("total") for c in cs]
        row["compute_passes_mean"] = float(np.mean(cv)) if cv and all(v is not None for v in cv) else None
        rows.append(row)
    return rows


def paired_vs_random(cells: list[dict[str, Any]], metrics: tuple[str, ...] = PAIRED_METRICS,
                     level: float = 0.95, baseline: str = "random") -> list[dict[str, Any]]:
    """Each strategy against random selection (or the strategy named ``baseline``), paired by seed.

    For every (strategy, budget) group other than random and every metric, the differences
    ``strategy - random`` on the seeds both ran (same seed: same white-box attack seeds, so attack noise cancels)
    give ``mean_diff`` and its ``level`` t-interval ``mean_diff +- t_{(1+level)/2, n-1} * sd / sqrt(n)``
    (``ci_low``, ``ci_high``; None with one seed, equal to the mean when every difference is the same).
    A budget-free strategy (``all``, ``adv-train``) is compared with random at every budget random ran, and
    the row carries random's budget. Rows: ``{strategy, budget, metric, mean_diff, ci_low, ci_high,
    n_seeds}``, in the order of the cells; an empty list without random cells. ``baseline`` names the
    reference strategy in place of random (e.g. a plain fine-tune against the enhancement recipes), with
    everything else the same.
    """
    from scipy import stats

    if not 0 < level < 1:
        raise ConfigError(f"level must lie in (0, 1), got {level!r}")
    rand: dict[str, dict[int, dict[str, Any]]] = {}
    order: list[tuple[str, str]] = []
    groups: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for c in cells:
        b = str(c["budget"])
        if c["strategy"] == baseline:
            rand.setdefault(b, {})[c["seed"]] = c
        else:
            if (c["strategy"], b) not in groups:
                order.append((c["strategy"], b))
            groups.setdefault((c["strategy"], b), {})[c["seed"]] = c
    budget_of = {str(c["budget"]): c["budget"] for c in cells}
    rows: list[dict[str, Any]] = []
    for s, b in order:
        targets = list(rand) if s in BUDGET_FREE else [b]
        for rb in targets:
            if rb not in rand:
                continue
            for m in metrics:
                diffs = []
                for sd, c in groups[(s, b)].items():
                    r = rand[rb].get(sd)
                    if r is None:
                        continue
                    a, z = c["robustness"].get(m), r["robustness"].get(m)
                    if a is not None and z is not None:
                        diffs.append(float(a) - float(z))
                if not diffs:
                    continue
                mean = float(np.mean(diffs))
                lo = hi = None
                if len(diffs) > 1:
                    half = float(stats.t.ppf((1 + level) / 2, len(diffs) - 1)) * float(np.std(diffs, ddof=1)) \
                        / np.sqrt(len(diffs))
                    lo, hi = float(mean - half), float(mean + half)
                rows.append({"strategy": s, "budget": budget_of[rb], "metric": m, "mean_diff": mean, "ci_low": lo,
                             "ci_high": hi, "n_seeds": len(diffs)})
    return rows
