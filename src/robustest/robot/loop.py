"""The iterative RobOT loop (:func:`run`): rounds of generate -> select -> fine-tune -> measure, and the
FOL convergence rule that stops it."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from robustest.core.atomic import atomic_save, atomic_write_json
from robustest.core.compute import PassCounter
from robustest.core.errors import ConfigError
from robustest.core.seeding import derive_seed
from robustest.robot.compare import compare
from robustest.robot.compute import cell_compute
from robustest.robot.config import HARDEN_STRATEGIES, RobotConfig, parse_budget
from robustest.robot.pool import Pool, coverage_profile_of, fol_of, generate_pool, select_tests
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


# ------------------------------------------------------------------------------------- convergence rule
def convergence_update(history: list[float], tol: float, patience: int) -> dict[str, Any]:
    """Apply the FOL convergence rule to the per-round statistic ``history`` (m_0, m_1, ..., m_r).

    Returns ``{"statistic": m_r, "rel_change": |m_r - m_{r-1}| / |m_{r-1}| (None for r = 0),
    "streak": consecutive rounds with rel_change < tol, "converged": streak >= patience}``.
    """
    if not history:
        raise ConfigError("convergence_update needs at least one statistic")
    streak, rel = 0, None
    for prev, cur in zip(history[:-1], history[1:]):
        rel = abs(cur - prev) / max(abs(prev), 1e-12)
        streak = streak + 1 if rel < tol else 0
    return {"statistic": float(history[-1]), "rel_change": rel, "streak": streak, "converged": streak >= patience}



def _convergence_stat(model: nn.Module, setup: RunSetup, cfg: RobotConfig, seed: int) -> tuple[torch.Tensor, dict]:
    """FOL values of fresh PGD tests against ``model`` from the fixed probe subset of the training data."""
    from robustest import attacks

    g = torch.Generator().manual_seed(derive_seed(cfg.seed, "probe"))
    m = min(cfg.convergence_probe, len(setup.x_fit))
    idx = torch.sort(torch.randperm(len(setup.x_fit), generator=g)[:m]).values
    x0, y0 = setup.x_fit[idx], setup.y_fit[idx]
    res = attacks.attack("pgd", model, (x0, y0), eps=cfg.eps, alpha=cfg.eps / 6, steps=cfg.pool_pgd_steps,
                         random_start=True, seed=seed)
    fol = fol_of(model, res.adv.detach().cpu(), y0, x0, cfg.eps)
    return fol, {"fol": quantiles(fol), "attack_success_rate": float(res.success.float().mean())}


# ----------------------------------------------------------------------------------------------- run()
def run(config: RobotConfig | dict[str, Any], model: nn.Module | None = None) -> dict[str, Any]:
    """Run the RobOT loop (or, when ``config.strategies`` is set, the strategy comparison :func:`compare`).

    Each round either generates a pool against the current model, selects ``budget`` tests with a selection
    strategy and fine-tunes on the training data + every test selected so far, or (a harden strategy; the
    default ``adv-train``) fine-tunes by adversarial training against the current model, no pool.

    ``model``: the model to test and improve (default: ``config.model`` loaded, or trained from scratch).
    Writes results.json, timings.json, summary.csv and report.html to ``config.out`` and returns the
    results dict (schema in docs/RESULTS_SCHEMA.md).
    """
    cfg = config if isinstance(config, RobotConfig) else RobotConfig.from_dict(config)
    cfg.validate()
    if cfg.strategies is not None:
        return compare(cfg, model=model)
    if cfg.strategy in HARDEN_STRATEGIES and (cfg.pool != "attack" or cfg.fuzz_options):
        raise ConfigError(f"pool {cfg.pool!r} feeds the selection strategies, but strategy {cfg.strategy!r} (the "
                          "default) trains on examples it generates against the current model and uses no pool: set "
                          "strategy to a selection strategy (e.g. random) or drop the pool settings")
    out = prepare_out(cfg, "loop")
    t_start = time.perf_counter()
    setup = prepare_setup(cfg, out, model, "loop")
    timings: dict[str, Any] = {"setup": setup.timings, "rounds": []}
    state = out / "state"
    model_cur = setup.model0
    tests = Pool.empty_like(setup.x_fit)
    probe_path = state / "round000_fol.pt"
    if probe_path.is_file():
        p = torch.load(probe_path, map_location="cpu", weights_only=True)
        fol0, conv0 = p["fol"], p["info"]
    else:
        fol0, conv0 = _convergence_stat(model_cur, setup, cfg, derive_seed(cfg.seed, "probe-attack", 0))
        atomic_save({"fol": fol0, "info": conv0}, probe_path)
    stats = [conv0["fol"]["median"]]
    fol_by_round = {0: fol0}
    rounds: list[dict[str, Any]] = []
    stop_reason = "rounds"
    elapsed_prev = 0.0
    tpath = out / "timings.json"
    if cfg.resume and tpath.is_file():
        try:
            elapsed_prev = float(json.loads(tpath.read_text()).get("elapsed_s", 0.0))
        except (OSError, ValueError, json.JSONDecodeError):
            elapsed_prev = 0.0
    for r in range(1, cfg.rounds + 1):
        rdir = state / f"round{r:03d}"
        rec_path = rdir / "round.json"
        if rec_path.is_file():  # finished earlier: load, do not redo
            from robustest.models.checkpoints import clone_model, restore_weights

            rec = json.loads(rec_path.read_text())
            model_cur = restore_weights(clone_model(setup.model0), rdir / "model.pt")
            sel = Pool.from_payload(torch.load(rdir / "selected.pt", map_location="cpu", weights_only=True))
            tests = tests.concat(sel)
            fol_by_round[r] = torch.load(rdir / "fol.pt", map_location="cpu", weights_only=True)
            rounds.append(rec)
            stats.append(rec["convergence"]["statistic"])
            log_progress(cfg, f"round {r}: loaded (finished earlier)")
        else:
            if cfg.time_budget is not None and elapsed_prev + time.perf_counter() - t_start >= cfg.time_budget:
                stop_reason = "time"
                break
            rec, model_cur, sel, fol_r, tr = _one_round(r, model_cur, setup, tests, cfg, stats, rdir)
            tests = tests.concat(sel)
            fol_by_round[r] = fol_r
            rounds.append(rec)
            stats.append(rec["convergence"]["statistic"])
            timings["rounds"].append(tr)
        rob = rec["robustness"]
        aa = f"AutoAttack {fmt_acc(rob['autoattack_accuracy'])}, " if rob.get("autoattack_accuracy") is not None else ""
        log_progress(cfg, f"round {r}: pool {rec['pool']['size']}, selected {rec['selected']['n']}, "
                          f"clean {fmt_acc(rob['clean_accuracy'])}, "
                          f"fixed-set {fmt_acc(rob['fixed_set_accuracy'])}, "
                          f"white-box {fmt_acc(rob['whitebox_accuracy'])}, {aa}"
                          f"median FOL {rec['convergence']['statistic']:.4g}")
        if cfg.target is not None and rob.get(cfg.target_metric) is not None and rob[cfg.target_metric] >= cfg.target:
            stop_reason = "requirement"
            break
        if rec["convergence"]["converged"]:
            stop_reason = "converged"
            break
    results = {
        "format": RESULTS_FORMAT, "version": RESULTS_VERSION, "kind": "loop",
        "config": cfg.result_dict(), "data": setup.info, "baseline": robustness_figures(setup.baseline),
        "convergence_rule": {"statistic": "median FOL of fresh PGD tests on the probe set",
                             "tol": cfg.convergence_tol, "patience": cfg.convergence_patience,
                             "probe": min(cfg.convergence_probe, len(setup.x_fit)), "round0": conv0},
        "rounds": rounds, "stop_reason": stop_reason, "rounds_completed": len(rounds),
        "num_selected_total": len(tests),
    }
    elapsed = elapsed_prev + time.perf_counter() - t_start
    timings["elapsed_s"] = elapsed
    write_outputs(out, results, timings, setup, cfg, fol_by_round=fol_by_round, examples=tests, compare_data=None)
    return results



def _one_round(r: int, model_cur: nn.Module, setup: RunSetup, tests: Pool, cfg: RobotConfig, stats: list[float],
               rdir: Path) -> tuple[dict[str, Any], nn.Module, Pool, torch.Tensor, dict[str, float]]:
    from robustest.models.checkpoints import save_weights

    t0 = time.perf_counter()
    seed_r = derive_seed(cfg.seed, "round", r)
    adv = cfg.strategy in HARDEN_STRATEGIES
    profile = None
    cost: dict[str, Any] = {"generation": 0.0, "fol_scoring": 0.0}
    sel_cost: dict[str, Any] = {"selection_scoring": 0.0}
    if cfg.strategy == "coverage" or cfg.pool == "cov-fuzz":
        with PassCounter(model_cur) as pc:
            profile = coverage_profile_of(model_cur, setup.x_fit, cfg)
        cost["profile"] = pc.passes
    if adv:  # adversarial training generates its own examples every batch: no pool, no selection
        pool = Pool.empty_like(setup.x_fit)
    else:
        pool = generate_pool(model_cur, setup.x_fit, setup.y_fit, cfg, derive_seed(seed_r, "pool"), profile=profile,
                             compute=cost)
    t_pool = time.perf_counter() - t0
    n = parse_budget(cfg.budget, len(pool))
    t1 = time.perf_counter()
    cache: dict[str, Any] = {"fol_passes": cost["fol_scoring"],
                             "profile_passes": cost.get("profile") if cfg.pool != "cov-fuzz" else 0.0}
    idx = torch.zeros(0, dtype=torch.long) if adv else select_tests(
        cfg.strategy, model_cur, pool, n, cfg, derive_seed(seed_r, "select"), profile=profile, cache=cache,
        compute=sel_cost)
    sel = pool.subset(idx)
    t2 = time.perf_counter()
    if adv:
        new_model, last_model, tr = adversarial_finetune(model_cur, setup, cfg, derive_seed(seed_r, "finetune"),
                                                  method=HARDEN_STRATEGIES[cfg.strategy])
    else:
        new_model, last_model, tr = finetune_on_tests(model_cur, setup, tests.concat(sel), cfg,
                                              derive_seed(seed_r, "finetune"))
    t3 = time.perf_counter()
    rob = measure_model(new_model, setup.test, setup.fixed, cfg, derive_seed(seed_r, "measure"))
    last = last_figures(rob, last_model, setup, cfg, derive_seed(seed_r, "measure"))
    fol_r, conv = _convergence_stat(new_model, setup, cfg, derive_seed(cfg.seed, "probe-attack", r))
    rule = convergence_update(stats + [conv["fol"]["median"]], cfg.convergence_tol, cfg.convergence_patience)
    t4 = time.perf_counter()
    gen_cost = cost["generation"]
    if cfg.pool == "cov-fuzz" and gen_cost is not None:  # the fuzzer needs the profile: part of generating
        gen_cost = None if cost.get("profile") is None else gen_cost + cost["profile"]
    rec = {
        "round": r,
        "pool": {"size": len(pool), "by_method": pool.counts(), "fol": quantiles(pool.fol)},
        "selected": {"n": len(sel), "budget": cfg.budget, "strategy": cfg.strategy, "by_method": sel.counts(),
                     "fol": quantiles(sel.fol), "pool_index_sha256": hashlib.sha256(
                         idx.numpy().tobytes()).hexdigest()[:16]},
        "train": tr["history"],
        "robustness": robustness_figures(rob),
        "robustness_last_epoch": last,
        "convergence": {**rule, **conv},
        "compute": cell_compute(pool_generation=gen_cost, selection_scoring=sel_cost["selection_scoring"],
                                finetune=tr["passes"], adversarial=tr["adversarial_passes"]),
    }
    save_weights(rdir / "model.pt", new_model, metadata={"round": r})
    atomic_save({**sel.payload(), "pool_index": idx}, rdir / "selected.pt")
    atomic_save(fol_r, rdir / "fol.pt")
    atomic_write_json(rdir / "round.json", rec)  # written last: its presence marks the round finished
    tim = {"round": r, "pool_s": t_pool, "select_s": t2 - t1, "finetune_s": t3 - t2, "measure_s": t4 - t3,
           "total_s": time.perf_counter() - t0}
    return rec, new_model, sel, fol_r, tim

