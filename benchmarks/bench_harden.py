"""Robustness against compute for the hardening methods of ``robustest harden`` (docs/HARDEN.md).

For every method and seed, a copy of the same pretrained model (``--checkpoint``: fine-tuning) or of the same
randomly initialised zoo model (``--model NAME --from-scratch``: the seed's initial weights) is trained
adversarially on the first ``--train-limit`` training images with the recipe of ``--schedule`` and
``--eps-warmup`` (harden's defaults: constant rate, 0.3) at the radius ``--eps-train`` (default ``--eps``); after
every epoch the script records the cumulative training compute (forward+backward passes,
robustest.train.hardening's accounting), the white-box accuracy (at ``--eps``) on a fixed test subset (per-sample
worst case of PGD-``--pgd-steps`` with ``--restarts`` restarts and APGD-CE-``--apgd-steps``, the same attack seeds
for every model: common random numbers) and the clean accuracy on the test split. With
``--autoattack fast|standard``, the final model of every run (and the pretrained one) is also evaluated with
robustest's AutoAttack-style ensemble (``robustest.evaluate.evaluate``) on the same test subset.

Methods: pgd-at, trades, fosc, fol-budget, fast-at, n-fgsm, grad-align (robustest.train.hardening) and
``reference``: an independent plain-PyTorch PGD-AT of the same recipe written below (no robustest code in its
training loop: own shuffling, random start, PGD loop, eps ramp, cosine or cyclic rate, eval mode for the attack and
train mode for the update, Adam), to check that our pgd-at lands where a textbook implementation does;
``reference-trades``: the same loop with TRADES' inner maximisation and loss (beta: the trades runs' ``--method-kw``,
else trades' default).
Training time is recorded as wall seconds and as the process's CPU seconds (``train CPU-min``: the figure the
targets are stated in, robust to a shared machine).

Outputs (resumable: every finished run is OUT/runs/<method>_s<seed>.json and is skipped when rerun):
OUT/results.json (settings, per-run curves, summary), OUT/summary.md (the tables), OUT/curves.png (white-box and
clean accuracy against compute, mean over seeds with the spread as error bars).

Usage (from scratch, the MNIST recipe of docs/HARDEN.md):
    python benchmarks/bench_harden.py --dataset mnist --data-dir ../shared/data --model mnist_small --from-scratch \\
        --eps 0.3 --train-limit 20000 --epochs 10 --batch-size 100 --methods pgd-at,reference --seeds 0 \\
        --autoattack standard --aa-limit 1000 --out /tmp/bench-harden-scratch
Usage (fine-tuning):
    robustest train --dataset mnist --data-dir ../shared/data --model lenet5 --epochs 3 --out /tmp/lenet5
    python benchmarks/bench_harden.py --dataset mnist --data-dir ../shared/data --checkpoint /tmp/lenet5/model.pt \\
        --eps 0.3 --train-limit 10000 --epochs 4 --out /tmp/bench-harden-mnist
    robustest train --dataset digits --model digits_cnn --epochs 20 --out /tmp/digits
    python benchmarks/bench_harden.py --dataset digits --checkpoint /tmp/digits/model.pt --eps 0.2 --epochs 5 \\
        --eval-limit 360 --out /tmp/bench-harden-digits
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ALL = ("pgd-at", "reference", "trades", "reference-trades", "fosc", "fol-budget", "fast-at", "n-fgsm",
       "grad-align")


# ------------------------------------------------------------------------ the independent reference recipe
#: the learning-rate schedules the plain-PyTorch reference implements
REFERENCE_SCHEDULES = ("none", "cosine", "cyclic")

def reference_pgd_batch(model: torch.nn.Module, xb: torch.Tensor, yb: torch.Tensor, gen: torch.Generator, *,
                        e: float, a: float, steps: int, twin: bool = False) -> torch.Tensor:
    """Plain PGD-AT for one batch: ``steps`` signed-gradient steps of ``a`` from a uniform random start in the
    L-inf ball of radius ``e`` (eval mode), projected to the ball and [0, 1]; then the cross-entropy of the
    adversarial batch in train mode (returned, graph attached). ``twin``: robustest's order of drawing the start."""
    model.eval()
    noise = torch.rand(xb.shape, generator=gen)
    noise = noise.mul_(2 * e).sub_(e) if twin else (noise * 2 - 1) * e
    x_adv = (xb + noise).clamp(0, 1)
    for _ in range(steps):
        x_adv.requires_grad_(True)
        loss = F.cross_entropy(model(x_adv), yb)
        (grad,) = torch.autograd.grad(loss, x_adv)
        x_adv = x_adv.detach() + a * grad.sign()
        x_adv = torch.min(torch.max(x_adv, xb - e), xb + e).clamp(0, 1)
    model.train()
    return F.cross_entropy(model(x_adv), yb)


def reference_trades_batch(model: torch.nn.Module, xb: torch.Tensor, yb: torch.Tensor, gen: torch.Generator, *,
                           e: float, a: float, steps: int, beta: float) -> torch.Tensor:
    """Plain TRADES (Zhang et al. 2019, their reference code's PGD-KL and loss) for one batch: ``steps`` signed
    steps of ``a`` on KL(p(x) || p(x')) from x + 0.001 N(0, I) (eval mode), projected to the ball and [0, 1], then
    the loss CE(f(x), y) + beta * KL(p(x) || p(x_adv)) / B in train mode (returned, graph attached)."""
    model.eval()
    with torch.no_grad():
        p_nat = F.softmax(model(xb), dim=1)
    x_adv = (xb + 0.001 * torch.randn(xb.shape, generator=gen)).clamp(0, 1)
    x_adv = torch.min(torch.max(x_adv, xb - e), xb + e)
    for _ in range(steps):
        x_adv.requires_grad_(True)
        kl = F.kl_div(F.log_softmax(model(x_adv), dim=1), p_nat, reduction="sum")
        (grad,) = torch.autograd.grad(kl, x_adv)
        x_adv = x_adv.detach() + a * grad.sign()
        x_adv = torch.min(torch.max(x_adv, xb - e), xb + e).clamp(0, 1)
    model.train()
    logits_nat, logits_adv = model(xb), model(x_adv)
    kl = F.kl_div(F.log_softmax(logits_adv, dim=1), F.softmax(logits_nat, dim=1), reduction="sum") / xb.shape[0]
    return F.cross_entropy(logits_nat, yb) + beta * kl


def reference_pgd_at(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, eps: float, steps: int,
                     alpha: float, epochs: int, batch_size: int, lr: float, seed: int, on_epoch_end,
                     eps_warmup: float = 0.0, schedule: str = "none", twin: bool = False,
                     trades_beta: float | None = None) -> None:
    """Madry et al. PGD adversarial training in plain PyTorch: per batch, ``steps`` signed-gradient steps of
    ``alpha`` from a uniform random start in the L-inf ball (model in eval mode), projected to the ball and to
    [0, 1]; then one Adam step on the cross-entropy of the adversarial batch (model in train mode). The textbook
    recipe around it: with ``eps_warmup`` the radius of batch t (0-based, of T) is ``eps * min(1, (t + 1) /
    (eps_warmup * T))`` and alpha scales with it; with ``schedule`` "cosine" the rate of batch t is
    ``lr * (1 + cos(pi * t / T)) / 2``, with "cyclic" Wong et al.'s triangle,
    ``lr * min((t + 1) / P, (T - t - 1) / (T - P))`` with its peak at ``P = 0.4 T`` batches.

    Its random numbers are its own (one generator for shuffling and starts). ``twin=True`` draws instead the
    numbers robustest's pgd-at draws (per-epoch generators seeded from (seed, epoch)), for the check that the
    two recipes then give the same weights. With ``trades_beta`` the batch's inner maximisation and loss are
    TRADES' (:func:`reference_trades_batch`) in the same recipe."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    torch.manual_seed(20_000 + seed)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    n = x.shape[0]
    total = epochs * (-(-n // batch_size))
    peak, ramp = 0.4 * total, eps_warmup * total
    rate_of = {"cosine": lambda t: lr * 0.5 * (1 + math.cos(math.pi * t / total)),  # the rate of batch t
               "cyclic": lambda t: lr * min((t + 1) / peak, (total - t - 1) / (total - peak))}.get(schedule)
    t = 0
    for epoch in range(1, epochs + 1):
        if twin:
            from robustest.core.seeding import derive_seed

            torch.manual_seed(derive_seed(seed, epoch, "global"))
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(seed, epoch, "shuffle")))
            gen = torch.Generator().manual_seed(derive_seed(seed, epoch, "attack"))
        else:
            perm = torch.randperm(n, generator=gen)
        for s in range(0, n, batch_size):
            idx = perm[s:s + batch_size]
            xb, yb = x[idx], y[idx]
            if rate_of is not None:
                for group in opt.param_groups:
                    group["lr"] = rate_of(t)
            e = eps * min(1.0, (t + 1) / ramp) if ramp > 1 else eps
            a = alpha * e / eps
            if trades_beta is not None:
                loss = reference_trades_batch(model, xb, yb, gen, e=e, a=a, steps=steps, beta=trades_beta)
            else:
                loss = reference_pgd_batch(model, xb, yb, gen, e=e, a=a, steps=steps, twin=twin)
            opt.zero_grad()
            loss.backward()
            opt.step()
            t += 1
        model.eval()
        per_image = steps + 1 if trades_beta is None else steps + 2 + 1 / 3  # harden's accounting of each
        on_epoch_end(epoch, model, {"compute": {"passes": float(n * per_image)}})


# ------------------------------------------------------------------------------------------------- runs
def measure(model, test_x, test_y, wb_x, wb_y, args) -> dict[str, float]:
    from robustest.evaluate import accuracy, whitebox_accuracy

    wb = whitebox_accuracy(model, (wb_x, wb_y), args.eps, pgd_steps=args.pgd_steps, pgd_restarts=args.restarts,
                           apgd_steps=args.apgd_steps, seed=12345)
    return {"whitebox": wb["worst"], "whitebox_pgd": wb["pgd"], "whitebox_apgd": wb["apgd"],
            "clean": accuracy(model, (test_x, test_y))}


def autoattack_accuracy(model, aa_x, aa_y, args) -> tuple[float, list[str]]:
    """(robust accuracy, the names of the evaluation's flags) under robustest.evaluate's ensemble (``--autoattack``
    version) on the first ``--aa-limit`` test images: a flag such as ``gradient-free-breaks`` makes the accuracy an
    upper bound."""
    from robustest.evaluate import evaluate

    res = evaluate(model, (aa_x, aa_y), args.eps, version=args.autoattack, seed=12345)
    return float(res.robust_accuracy), [f.name for f in res.flags]


def recipe_kw(args) -> dict[str, Any]:
    """harden()'s recipe and eps warm-up from the flags (the reference takes the same recipe)."""
    from robustest.train import Recipe

    return {"recipe": Recipe(lr=args.lr, schedule=args.schedule), "eps_warmup": args.eps_warmup,
            "eps_train": args.eps_train}


def reference_kw(args) -> dict[str, Any]:
    if args.schedule not in REFERENCE_SCHEDULES:
        raise SystemExit(f"the reference implements the schedules {', '.join(REFERENCE_SCHEDULES)}, "
                         f"not {args.schedule!r}")
    return {"eps_warmup": args.eps_warmup, "schedule": args.schedule}


def base_model(base, seed: int, args):
    """The model every method of ``seed`` starts from: the checkpoint, or --model built with random weights seeded
    by ``seed`` (--from-scratch)."""
    if base is not None:
        return copy.deepcopy(base)
    from robustest import models

    torch.manual_seed(seed)
    return models.create(args.model, num_classes=args.num_classes, in_channels=args.in_channels,
                         input_size=args.input_size).eval()


def one_run(name: str, seed: int, base, train, test, wb, aa, args) -> dict[str, Any]:
    from robustest.train import objectives
    from robustest.train.hardening import harden

    model = base_model(base, seed, args)
    curve: list[dict[str, Any]] = []
    state = {"passes": 0.0, "train_s": 0.0, "train_cpu_s": 0.0, "t": time.perf_counter(), "c": time.process_time()}

    def on_epoch_end(epoch, m, record):
        state["train_s"] += time.perf_counter() - state["t"]
        state["train_cpu_s"] += time.process_time() - state["c"]
        state["passes"] += float(record["compute"]["passes"])
        row = {"epoch": epoch, "passes": state["passes"], "passes_per_image": state["passes"] / len(train[0]),
               "train_s": state["train_s"], "train_cpu_s": state["train_cpu_s"], **measure(m, *test, *wb, args)}
        for k in ("attack_evals_mean", "stopped_early", "fosc_c"):
            if k in record:
                row[k] = record[k]
        if args.autoattack and epoch == epochs:
            row["autoattack"], row["autoattack_flags"] = autoattack_accuracy(m, *aa, args)
            row["autoattack_version"] = args.autoattack
        curve.append(row)
        aa_txt = (f", AutoAttack {row['autoattack']:.4f} (flags: {', '.join(row['autoattack_flags']) or 'none'})"
                  if "autoattack" in row else "")
        print(f"  {name} s{seed} epoch {epoch}: {row['passes_per_image']:.1f} passes/image, white-box "
              f"{row['whitebox']:.4f}{aa_txt}, clean {row['clean']:.4f} ({state['train_s']:.0f} s, "
              f"{state['train_cpu_s']:.0f} CPU-s)", flush=True)
        state["t"], state["c"] = time.perf_counter(), time.process_time()

    epochs = args.method_epochs.get(name, args.epochs)
    train_eps = args.eps if args.eps_train is None else args.eps_train
    if name == "reference":
        reference_pgd_at(model, *train, eps=train_eps, steps=args.steps, alpha=2.5 * train_eps / args.steps,
                         epochs=epochs, batch_size=args.batch_size, lr=args.lr, seed=seed, on_epoch_end=on_epoch_end,
                         **reference_kw(args))
        settings = {"method": "reference PGD-AT (plain PyTorch)", "eps": args.eps, "eps_train": train_eps,
                    "steps": args.steps, "alpha": 2.5 * train_eps / args.steps, "epochs": epochs,
                    "batch_size": args.batch_size, "lr": args.lr, "seed": seed, **reference_kw(args)}
    elif name == "reference-trades":
        default = next(o.default for o in objectives.get("trades").options if o.name == "beta")
        beta = float(args.method_kw.get("trades", {}).get("beta", default))  # the beta of the trades runs
        reference_pgd_at(model, *train, eps=train_eps, steps=args.steps, alpha=2.5 * train_eps / args.steps,
                         epochs=epochs, batch_size=args.batch_size, lr=args.lr, seed=seed, on_epoch_end=on_epoch_end,
                         trades_beta=beta, **reference_kw(args))
        settings = {"method": "reference TRADES (plain PyTorch)", "eps": args.eps, "eps_train": train_eps,
                    "steps": args.steps, "alpha": 2.5 * train_eps / args.steps, "beta": beta, "epochs": epochs,
                    "batch_size": args.batch_size, "lr": args.lr, "seed": seed, **reference_kw(args)}
    else:
        kw = dict(args.method_kw.get(name, {}))
        kw = {**recipe_kw(args), **kw}
        steps = None if objectives.get(name).fixed_steps else args.steps  # single-step methods take no steps
        res = harden(model, train, name, eps=args.eps, epochs=epochs, steps=steps, batch_size=args.batch_size,
                     seed=seed, on_epoch_end=on_epoch_end, keep="last", **kw)
        settings = res.settings
    return {"method": name, "seed": seed, "settings": settings, "curve": curve}


def timing(base, train, args, reps: int = 3, n: int = 2000) -> dict[str, Any]:
    """Wall time of one epoch on the first ``n`` training images: robustest pgd-at vs the reference recipe vs
    fol-budget, interleaved ``reps`` times (the machine is shared: the minimum of each is kept, and the ratios
    of minima are what this measures). Returns seconds and seconds per forward+backward pass."""
    from robustest.train.hardening import harden

    x, y = train[0][:n], train[1][:n]
    n = int(x.shape[0])
    times: dict[str, list[float]] = {"pgd-at": [], "reference": [], "fol-budget": []}
    passes: dict[str, float] = {}
    for _ in range(reps):
        for name in times:
            model = base_model(base, 0, args)
            t0 = time.perf_counter()
            if name == "reference":
                reference_pgd_at(model, x, y, eps=args.eps, steps=args.steps, alpha=2.5 * args.eps / args.steps,
                                 epochs=1, batch_size=args.batch_size, lr=args.lr, seed=0,
                                 on_epoch_end=lambda *a: None, **reference_kw(args))
                passes[name] = float(n * (args.steps + 1))
            else:
                res = harden(model, (x, y), name, eps=args.eps, epochs=1, steps=args.steps,
                             batch_size=args.batch_size, seed=0, **recipe_kw(args))
                passes[name] = float(res.compute["passes"])
            times[name].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in times.items()}
    return {"images": n, "reps": reps, "seconds": times, "best_s": best, "passes": passes,
            "ms_per_pass": {k: 1000 * best[k] / passes[k] for k in best},
            "pgd_at_over_reference": best["pgd-at"] / best["reference"],
            "fol_budget_time_ratio": best["fol-budget"] / best["pgd-at"],
            "fol_budget_pass_ratio": passes["fol-budget"] / passes["pgd-at"]}


def twin_check(base, train, args, n: int = 2000, epochs: int = 2) -> dict[str, Any]:
    """robustest's pgd-at and the reference, fed the same random numbers, on the first ``n`` training images:
    the largest difference of any weight after ``epochs`` epochs (0.0 = the same recipe)."""
    from robustest.train.hardening import harden

    x, y = train[0][:n], train[1][:n]
    ours, ref = base_model(base, 0, args), base_model(base, 0, args)
    harden(ours, (x, y), "pgd-at", eps=args.eps, epochs=epochs, steps=args.steps, batch_size=args.batch_size,
           seed=0, **recipe_kw(args))
    reference_pgd_at(ref, x, y, eps=args.eps, steps=args.steps, alpha=2.5 * args.eps / args.steps, epochs=epochs,
                     batch_size=args.batch_size, lr=args.lr, seed=0, on_epoch_end=lambda *a: None, twin=True,
                     **reference_kw(args))
    a, b = ours.state_dict(), ref.state_dict()
    return {"images": int(x.shape[0]), "epochs": epochs,
            "max_abs_weight_difference": max(float((a[k] - b[k]).abs().max()) for k in a)}


# ---------------------------------------------------------------------------------------------- summary
def _ms(vals: list[float]) -> tuple[float, float]:
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def summarise(runs: list[dict[str, Any]], before: dict[str, float], args) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["method"], []).append(r)
    curves: dict[str, list[dict[str, float]]] = {}
    for name, rs in by.items():
        n_ep = min(len(r["curve"]) for r in rs)
        rows = []
        for i in range(n_ep):
            pts = [r["curve"][i] for r in rs]
            wb_m, wb_s = _ms([p["whitebox"] for p in pts])
            cl_m, cl_s = _ms([p["clean"] for p in pts])
            rows.append({"epoch": i + 1, "passes_per_image": statistics.fmean(p["passes_per_image"] for p in pts),
                         "whitebox_mean": wb_m, "whitebox_std": wb_s, "clean_mean": cl_m, "clean_std": cl_s,
                         "train_s_mean": statistics.fmean(p["train_s"] for p in pts),
                         "train_cpu_s_mean": statistics.fmean(p.get("train_cpu_s", p["train_s"]) for p in pts)})
        curves[name] = rows
    table = []
    ref = curves.get("pgd-at")
    for name in [m for m in ALL if m in curves]:
        last = curves[name][-1]
        row = {"method": name, "seeds": len(by[name]), "epochs": last["epoch"],
               "passes_per_image": last["passes_per_image"], "whitebox_mean": last["whitebox_mean"],
               "whitebox_std": last["whitebox_std"], "clean_mean": last["clean_mean"], "clean_std": last["clean_std"],
               "train_s_mean": last["train_s_mean"], "train_cpu_s_mean": last["train_cpu_s_mean"],
               "per_seed_whitebox": [r["curve"][last["epoch"] - 1]["whitebox"] for r in by[name]]}
        finals = [r["curve"][-1].get("autoattack") for r in by[name]]
        row["autoattack_flags"] = sorted({f for r in by[name] for f in r["curve"][-1].get("autoattack_flags", [])})
        if finals and all(a is not None for a in finals) and all(len(r["curve"]) == last["epoch"] for r in by[name]):
            row["autoattack_mean"], row["autoattack_std"] = _ms(finals)
        if ref:
            target = ref[-1]["whitebox_mean"] - 0.01
            row["compute_ratio"] = last["passes_per_image"] / ref[-1]["passes_per_image"]
            hit = next((c for c in curves[name] if c["whitebox_mean"] >= target), None)
            row["reaches_pgd_at_minus_1pt_at_ratio"] = (hit["passes_per_image"] / ref[-1]["passes_per_image"]
                                                       if hit else None)
            row["reaches_at_epoch"] = hit["epoch"] if hit else None
        table.append(row)
    return {"before": before, "curves": curves, "table": table, "paired": paired_against_pgd_at(by)}


def _interval(diffs: list[float]) -> tuple[float, float, float]:
    """Mean of paired differences and its 95 % t-interval (a zero-width interval for one pair)."""
    from scipy import stats

    m = statistics.fmean(diffs)
    if len(diffs) < 2:
        return m, m, m
    h = stats.t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return m, float(m - h), float(m + h)


def _whitebox_at(curve: list[dict[str, Any]], passes: float) -> float | None:
    """White-box accuracy of a run's curve at ``passes`` per image, linear between its epochs (None beyond its
    last epoch, and before its first, where no model was measured)."""
    pts = [(c["passes_per_image"], c["whitebox"]) for c in curve]
    for (p0, w0), (p1, w1) in zip(pts, pts[1:]):
        if p0 <= passes <= p1:
            return w0 + (w1 - w0) * (passes - p0) / (p1 - p0) if p1 > p0 else w1
    return pts[0][1] if pts and abs(pts[0][0] - passes) < 1e-9 else None


def paired_against_pgd_at(by: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each method against pgd-at on the seeds both ran (the same initial weights and data order per seed):
    the paired difference of the final AutoAttack accuracy (at each method's own budget), and at matched
    compute the difference of white-box accuracy between the method's final model and pgd-at's curve at the
    same passes per image; means with 95 % t-intervals over the seeds."""
    base = {r["seed"]: r for r in by.get("pgd-at", [])}
    rows = []
    for name, rs in by.items():
        if name == "pgd-at":
            continue
        pairs = [(r, base[r["seed"]]) for r in rs if r["seed"] in base]
        if not pairs:
            continue
        ratio = statistics.fmean(r["curve"][-1]["passes_per_image"] / b["curve"][-1]["passes_per_image"]
                                 for r, b in pairs)
        row: dict[str, Any] = {"method": name, "seeds": len(pairs), "compute_ratio": ratio}
        aa = [(r["curve"][-1].get("autoattack"), b["curve"][-1].get("autoattack")) for r, b in pairs]
        if all(a is not None and c is not None for a, c in aa):
            row["autoattack_diff"], row["autoattack_ci_low"], row["autoattack_ci_high"] = _interval(
                [a - c for a, c in aa])
        matched = [(r["curve"][-1]["whitebox"], _whitebox_at(b["curve"], r["curve"][-1]["passes_per_image"]))
                   for r, b in pairs]
        if all(m is not None for _, m in matched):
            row["whitebox_matched_diff"], row["whitebox_matched_ci_low"], row["whitebox_matched_ci_high"] = (
                _interval([w - m for w, m in matched]))
        rows.append(row)
    return rows


def _diff_cell(row: dict[str, Any], key: str) -> str:
    """``+d.dd [lo, hi]`` in points for a paired difference of ``row`` ("-" when it was not measured)."""
    if f"{key}_diff" not in row:
        return "-"
    return f"{100 * row[f'{key}_diff']:+.2f} [{100 * row[f'{key}_ci_low']:+.2f}, {100 * row[f'{key}_ci_high']:+.2f}]"


def _paired_lines(paired: list[dict[str, Any]]) -> list[str]:
    """The paired table of summary.md; its AutoAttack column only when the runs were measured with it."""
    has_aa = any("autoattack_diff" in r for r in paired)
    lines = ["", "Paired against pgd-at (same seeds, points; 95 % t-intervals over the seeds): "
             + ("the final AutoAttack accuracy at each method's own budget, and " if has_aa else "")
             + "the white-box accuracy at matched compute (the method's final model against pgd-at's curve at the "
             "same passes per image):", "",
             "| method | seeds | x pgd-at passes | " + ("AutoAttack diff. | " if has_aa else "")
             + "white-box diff. at matched compute |", "|---|---|---|" + ("---|" if has_aa else "") + "---|"]
    for r in paired:
        aa = f"{_diff_cell(r, 'autoattack')} | " if has_aa else ""
        lines.append(f"| {r['method']} | {r['seeds']} | {r['compute_ratio']:.2f} | {aa}"
                     f"{_diff_cell(r, 'whitebox_matched')} |")
    return lines


def write_summary(summary: dict[str, Any], out: Path, args) -> str:
    b = summary["before"]
    has_aa = any("autoattack_mean" in r for r in summary["table"])
    aa_before = f", AutoAttack ({args.autoattack}) {b['autoattack']:.4f}" if "autoattack" in b else ""
    aa_on = f", AutoAttack on {args.aa_limit}" if has_aa else ""
    lines = [f"{args.dataset}, eps {args.eps}, {args.train_limit} training images, seeds {args.seeds_text}; "
             f"white-box on {args.eval_limit} test images (PGD-{args.pgd_steps} x {args.restarts} restarts + "
             f"APGD-CE-{args.apgd_steps}){aa_on}; recipe: {args.schedule} schedule, "
             f"eps warm-up {args.eps_warmup}, training radius {args.eps_train or args.eps}, batch {args.batch_size}, "
             f"lr {args.lr}; "
             f"before: white-box {b['whitebox']:.4f}{aa_before}, clean {b['clean']:.4f}",
             "", "| method | epochs | passes / image | x pgd-at | white-box acc. | "
             + ("AutoAttack acc. | " if has_aa else "") + "clean acc. | reaches pgd-at - 1 pt at | train s | "
             "train CPU-min |",
             "|---|---|---|---|---|" + ("---|" if has_aa else "") + "---|---|---|---|"]
    for r in summary["table"]:
        reach = r.get("reaches_pgd_at_minus_1pt_at_ratio")
        reach_txt = f"{reach:.2f}x (epoch {r['reaches_at_epoch']})" if reach is not None else "not reached"
        aa = ""
        if has_aa:
            flagged = f" (flagged: {', '.join(r['autoattack_flags'])})" if r.get("autoattack_flags") else ""
            aa = (f"{100 * r['autoattack_mean']:.2f} ± {100 * r['autoattack_std']:.2f}{flagged} | "
                  if "autoattack_mean" in r else "- | ")
        lines.append(f"| {r['method']} | {r['epochs']} | {r['passes_per_image']:.1f} | {r.get('compute_ratio', 1):.2f} "
                     f"| {100 * r['whitebox_mean']:.2f} ± {100 * r['whitebox_std']:.2f} | {aa}"
                     f"{100 * r['clean_mean']:.2f} ± {100 * r['clean_std']:.2f} | {reach_txt} "
                     f"| {r['train_s_mean']:.0f} | {r['train_cpu_s_mean'] / 60:.1f} |")
    if summary.get("paired"):
        lines += _paired_lines(summary["paired"])
    lines += ["", "Per epoch (mean over seeds):", "",
              "| method | epoch | passes / image | white-box acc. | clean acc. |", "|---|---|---|---|---|"]
    for name, rows in summary["curves"].items():
        for c in rows:
            lines.append(f"| {name} | {c['epoch']} | {c['passes_per_image']:.1f} | {100 * c['whitebox_mean']:.2f} ± "
                         f"{100 * c['whitebox_std']:.2f} | {100 * c['clean_mean']:.2f} ± {100 * c['clean_std']:.2f} |")
    t = summary.get("timing")
    if t:
        lines += ["", f"Wall time of one epoch on {t['images']} images (min of {t['reps']} interleaved runs): "
                  + ", ".join(f"{k} {t['best_s'][k]:.1f} s ({t['ms_per_pass'][k]:.3f} ms per pass)"
                              for k in t["best_s"])
                  + f"; pgd-at / reference {t['pgd_at_over_reference']:.2f}x; fol-budget / pgd-at "
                  f"{t['fol_budget_time_ratio']:.2f}x in time for {t['fol_budget_pass_ratio']:.2f}x the passes"]
    tw = summary.get("twin_check")
    if tw:
        lines += ["", f"Same random numbers, {tw['epochs']} epochs on {tw['images']} images: largest weight difference "
                  f"between robustest's pgd-at and the reference {tw['max_abs_weight_difference']:.3g}"]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def plot(summary: dict[str, Any], out: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    b = summary["before"]
    for name, rows in summary["curves"].items():
        xs = [0.0] + [c["passes_per_image"] for c in rows]
        for ax, key, first in ((axes[0], "whitebox", b["whitebox"]), (axes[1], "clean", b["clean"])):
            ax.errorbar(xs, [first] + [c[f"{key}_mean"] for c in rows], yerr=[0.0] + [c[f"{key}_std"] for c in rows],
                        marker="o", capsize=2, label=name)
    axes[0].set_ylabel("white-box accuracy (worst of PGD, APGD-CE)")
    axes[1].set_ylabel("clean accuracy")
    for ax in axes:
        ax.set_xlabel("training compute: forward+backward passes per training image")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{args.dataset}, eps {args.eps}: mean over seeds {args.seeds_text} (bars: std)", fontsize=10)
    fig.savefig(out / "curves.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def _kv(text: str) -> dict[str, int]:
    out = {}
    for part in filter(None, (t.strip() for t in text.split(","))):
        k, v = part.split("=")
        out[k.strip()] = int(v)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (the module docstring is its help)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True, help="digits or mnist")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--checkpoint", default=None, help="the pretrained model to fine-tune (robustest train)")
    ap.add_argument("--model", default=None, help="a zoo model trained from random weights (with --from-scratch), "
                    "e.g. mnist_small; every method of a seed starts from the same weights (torch seed = seed)")
    ap.add_argument("--from-scratch", action="store_true", help="train --model from scratch instead of --checkpoint")
    ap.add_argument("--schedule", choices=("none", "cosine", "step", "cyclic"), default="none",
                    help="learning-rate schedule of every method (the reference: none, cosine or cyclic; default: "
                         "none, harden's default)")
    ap.add_argument("--eps-warmup", type=float, default=0.3,
                    help="fraction of the training steps over which eps grows from 0 (default: 0.3)")
    ap.add_argument("--aa-limit", type=int, default=None,
                    help="AutoAttack on the first N test images (default: --eval-limit)")
    ap.add_argument("--eps", type=float, required=True)
    ap.add_argument("--eps-train", type=float, default=None,
                    help="the radius every method trains at, measured at --eps (harden's eps_train; default: --eps)")
    ap.add_argument("--train-limit", type=int, default=None, help="fine-tune on the first N training images")
    ap.add_argument("--eval-limit", type=int, default=500, help="white-box attacks on the first N test images")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--method-epochs", type=_kv, default={}, help="per-method epochs, e.g. fast-at=8,fol-budget=6")
    ap.add_argument("--method-kw", type=json.loads, default={}, help='per-method harden() arguments as JSON, e.g. '
                    '\'{"fol-budget": {"fol_threshold": 0.1}}\'')
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--methods", default=",".join(ALL))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--pgd-steps", type=int, default=20)
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--apgd-steps", type=int, default=50)
    ap.add_argument("--autoattack", choices=("fast", "standard"), default=None,
                    help="also evaluate every run's final model (and the pretrained one) with robustest.evaluate's "
                         "ensemble of this version on the white-box subset")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timing", action="store_true",
                    help="also time one epoch of pgd-at, the reference and fol-budget, interleaved (timing.json), "
                         "and run the reference with robustest's random numbers (twin check)")
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.seeds_text = args.seeds
    seeds = [int(s) for s in args.seeds.split(",")]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(methods) - set(ALL)
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}: choose from {', '.join(ALL)}")
    if any(m.startswith("reference") for m in methods):
        reference_kw(args)  # a schedule the reference lacks: refused before any work

    from robustest import data as datasets
    from robustest.core.errors import RobustestError
    from robustest.models.checkpoints import load_checkpoint

    if args.from_scratch != (args.model is not None) or (args.checkpoint is not None) == args.from_scratch:
        raise SystemExit("give --checkpoint FILE (fine-tuning) or --model NAME --from-scratch, not both")

    try:
        tr = datasets.load(args.dataset, root=args.data_dir, split="train").tensors
        te = datasets.load(args.dataset, root=args.data_dir, split="test").tensors
    except RobustestError as err:  # a missing or broken data set: its one-line message, no traceback
        raise SystemExit(str(err)) from None
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    n = args.train_limit or tr[0].shape[0]
    args.train_limit = n
    train = (tr[0][:n].contiguous(), tr[1][:n].contiguous())
    test = (te[0], te[1])
    wb = (te[0][:args.eval_limit], te[1][:args.eval_limit])
    args.aa_limit = args.aa_limit or args.eval_limit
    aa = (te[0][:args.aa_limit], te[1][:args.aa_limit])
    args.in_channels, args.input_size = int(tr[0].shape[1]), int(tr[0].shape[2])
    args.num_classes = int(tr[1].max()) + 1
    base = load_checkpoint(args.checkpoint).eval() if args.checkpoint else None
    before_model = base if base is not None else base_model(None, 0, args)
    before_path = out / "before.json"
    if before_path.is_file():
        before = json.loads(before_path.read_text())
    else:
        before = measure(before_model, *test, *wb, args)
    if args.autoattack and before.get("autoattack_version") != args.autoattack:
        before["autoattack"], before["autoattack_flags"] = autoattack_accuracy(before_model, *aa, args)
        before["autoattack_version"] = args.autoattack
    if not before_path.is_file() or args.autoattack:
        before_path.write_text(json.dumps(before))
    print(f"before: white-box {before['whitebox']:.4f}, clean {before['clean']:.4f}", flush=True)
    runs = []
    for seed in seeds:
        for name in methods:
            path = out / "runs" / f"{name}_s{seed}.json"
            if path.is_file():
                done = json.loads(path.read_text())
                if not args.autoattack or done["curve"][-1].get("autoattack_version") == args.autoattack:
                    runs.append(done)
                    continue
                print(f"{name} seed {seed}: run again for its final model's AutoAttack ({args.autoattack}) accuracy",
                      flush=True)
            print(f"{name} seed {seed}", flush=True)
            r = one_run(name, seed, base, train, test, wb, aa, args)
            path.write_text(json.dumps(r, indent=1))
            runs.append(r)
    summary = summarise(runs, before, args)
    if args.timing:
        tpath = out / "timing.json"
        if not tpath.is_file():
            tpath.write_text(json.dumps(timing(base, train, args), indent=1))
        summary["timing"] = json.loads(tpath.read_text())
        summary["twin_check"] = twin_check(base, train, args)
    settings = {k: v for k, v in vars(args).items() if k != "seeds_text"}
    (out / "results.json").write_text(json.dumps({"settings": settings, "runs": runs, **summary}, indent=1))
    print(write_summary(summary, out, args))
    plot(summary, out, args)
    print(f"wrote {out / 'results.json'}, {out / 'summary.md'} and {out / 'curves.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
