"""Certified training on MNIST within a CPU-time budget: ``mnist_small`` (Wong & Kolter's conv 16 / conv 32 / FC 100,
random weights, no normalisation layer) trained on all 60,000 training images with ``ibp`` (Gowal et al. 2018) or
``crown-ibp`` (Zhang et al. 2020) through ``robustest.train.harden`` on one CPU thread, then measured on the first
1,000 MNIST test images at the L-inf radius it trained for: clean accuracy, PGD accuracy (``robustest.attacks``'
PGD, ``--pgd-steps`` steps from a random start, best of ``--pgd-restarts``) and certified accuracy by IBP and by
CROWN (``robustest.certify``; CROWN's margins are never below IBP's, so its figure is the certified accuracy).
A sound run reads certified <= PGD <= clean.

Targets: certified accuracy of at least 90 % at eps 0.1 and 70 % at eps 0.3, each model trained within 60
CPU-minutes. One model per radius; the bounds train at a larger radius than the test one, as Zhang et al. (and
Gowal et al.) do on MNIST (``--eps-train``; default 0.2 for eps 0.1, 0.4 for eps 0.2 to 0.4, else eps).

The budget (``--minutes``: CPU minutes of training, default 55) sizes the run before it starts: a few batches of
each phase of the schedule (the clean warm-up, the ramp, after the ramp) are timed on a copy of the model, and
the run gets the most epochs whose predicted CPU time fits what is left of the budget (less ``--margin``); the
schedule's fractions (``--ramp-warmup``, ``--ramp-length``) and the cosine learning-rate decay stretch over those
epochs, so the ramp always finishes. Should training run slower than predicted, it stops after the last epoch
whose successor (its predicted time, scaled by how far the epochs so far ran over theirs) would not fit, keeping
that epoch's model (the JSON says ``stopped_by_budget``).

Writes the figures, settings, per-epoch records and CPU times to ``--out`` (JSON) and prints a table:

    taskset -c 0 python benchmarks/bench_certified_training.py --eps 0.1 --out /tmp/cert-01.json
    taskset -c 0 python benchmarks/bench_certified_training.py --eps 0.3 --out /tmp/cert-03.json
    python benchmarks/bench_certified_training.py --eps 0.1 --minutes 2 --out /tmp/cert-quick.json   # smoke run
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

DEFAULT_DATA = Path(os.environ.get("ROBUSTEST_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
#: Zhang et al. (2020)'s training radius for each MNIST test radius (Gowal et al. 2018 train 0.4 for 0.3 too)
EPS_TRAIN = {0.1: 0.2, 0.2: 0.4, 0.3: 0.4, 0.4: 0.4}
#: the targets: certified accuracy at each radius
TARGETS = {0.1: 0.90, 0.3: 0.70}


class OutOfBudget(Exception):
    """The next epoch would not fit in the CPU-time budget."""


def _cpu() -> float:
    return time.process_time()


# ------------------------------------------------------------------------------------------- the budget
def time_phases(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, s: dict[str, Any],
                repeats: int) -> dict[str, float]:
    """CPU seconds of one training batch of each phase of the schedule, on a copy of ``model`` with its own Adam:
    ``warmup`` (ramp position 0: the clean loss only), ``ramp`` (position 0.5: both terms; crown-ibp both bounds)
    and ``after`` (position 1: the settings' final kappa, and beta). Each is the mean over ``repeats`` batches of
    ``s["batch_size"]`` images taken in turn from (x, y), after one untimed batch."""
    from robustest.train import objectives
    from robustest.train.objectives import StepContext

    step = objectives.get(s["method"]).step
    m = copy.deepcopy(model)
    opt = torch.optim.Adam(m.parameters(), lr=s["lr"])
    # one epoch of 4 batches, warm-up 1 batch, ramp 2: batch 0 sits at position 0, batch 1 at 0.5, batch 3 at 1
    probe = {**s, "epochs": 1, "ramp_warmup": 0.25, "ramp_length": 0.5}
    out = {}
    for phase, i in (("warmup", 0), ("ramp", 1), ("after", 3)):
        ctx = StepContext(probe, epoch_number=1, step=i, steps_per_epoch=4)
        for k in range(repeats + 1):
            b0 = (k * s["batch_size"]) % max(1, x.shape[0] - s["batch_size"] + 1)
            xb, yb = x[b0:b0 + s["batch_size"]], y[b0:b0 + s["batch_size"]]
            t0 = _cpu()
            loss = step(m, xb, yb, None, ctx).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if k == 0:
                continue
            out[phase] = out.get(phase, 0.0) + (_cpu() - t0) / repeats
    return out


def plan_epochs(phases: dict[str, float], s: dict[str, Any], steps_per_epoch: int, budget_s: float,
                max_epochs: int | None) -> tuple[int, float]:
    """(epochs, predicted CPU seconds per epoch on average): the most epochs whose predicted time fits
    ``budget_s`` (at least 1), the batches split between the phases by the schedule's fractions."""
    w, length = s["ramp_warmup"], s["ramp_length"]
    per_batch = w * phases["warmup"] + length * phases["ramp"] + (1.0 - w - length) * phases["after"]
    per_epoch = per_batch * steps_per_epoch
    epochs = max(1, math.floor(budget_s / per_epoch))
    return (min(epochs, max_epochs) if max_epochs else epochs), per_epoch


def epoch_costs(phases: dict[str, float], s: dict[str, Any], steps_per_epoch: int, epochs: int) -> list[float]:
    """Predicted CPU seconds of each epoch: every batch costs its phase's time at its place on the ramp (crown-ibp's
    epochs on the ramp cost many times those after it, so the epochs so far do not predict the next)."""
    from robustest.train.schedules import ramp_schedule

    total = epochs * steps_per_epoch
    costs = []
    for e in range(epochs):
        c = 0.0
        for i in range(e * steps_per_epoch, (e + 1) * steps_per_epoch):
            r = ramp_schedule(i, total, s["ramp_warmup"], s["ramp_length"])
            c += phases["warmup"] if r == 0.0 else phases["after"] if r == 1.0 else phases["ramp"]
        costs.append(c)
    return costs


# ---------------------------------------------------------------------------------------- measurement
def measure(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float,
            args: argparse.Namespace) -> dict[str, Any]:
    """Clean, PGD and certified (IBP, CROWN) accuracy of ``model`` on (x, y) at ``eps``, with their CPU seconds."""
    from robustest import attacks, certify
    from robustest.evaluate import accuracy

    out: dict[str, Any] = {"cpu_s": {}}
    t0 = _cpu()
    out["clean_accuracy"] = float(accuracy(model, (x, y)))
    t1 = _cpu()
    res = attacks.attack("pgd", model, x, y, eps=eps, steps=args.pgd_steps, restarts=args.pgd_restarts, seed=0)
    out["pgd_accuracy"] = 1.0 - int(res.success.sum()) / max(1, int(res.success.numel()))
    t2 = _cpu()
    out["ibp_certified_accuracy"] = certify.ibp(model, x, y, eps).certified_accuracy
    t3 = _cpu()
    out["crown_certified_accuracy"] = certify.crown(model, x, y, eps).certified_accuracy
    t4 = _cpu()
    out["certified_accuracy"] = max(out["ibp_certified_accuracy"], out["crown_certified_accuracy"])
    out["cpu_s"] = {"clean": t1 - t0, "pgd": t2 - t1, "ibp": t3 - t2, "crown": t4 - t3}
    out["sound"] = out["certified_accuracy"] <= out["pgd_accuracy"] <= out["clean_accuracy"]
    return out


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", choices=("ibp", "crown-ibp"), default="ibp", help="certified training (default: ibp)")
    p.add_argument("--eps", type=float, default=0.1, help="L-inf test radius (default: 0.1)")
    p.add_argument("--eps-train", type=float, default=None,
                   help="radius the bounds train at (default: Zhang et al.'s: 0.2 for 0.1, 0.4 for 0.2-0.4, else eps)")
    p.add_argument("--minutes", type=float, default=55.0, help="CPU minutes of training, calibration included "
                   "(default: 55)")
    p.add_argument("--margin", type=float, default=0.1,
                   help="fraction of the budget kept free of the planned epochs, for the loop's own work and a busy "
                        "machine (default: 0.1)")
    p.add_argument("--max-epochs", type=int, default=None, help="at most this many epochs (default: the budget's)")
    p.add_argument("--batch-size", type=int, default=100, help="training batch size (default: 100, Gowal et al.)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's peak learning rate, cosine decay (default: 1e-3)")
    p.add_argument("--ramp-warmup", type=float, default=None, help="fraction of the steps of clean training before "
                   "the ramp (default: the method's)")
    p.add_argument("--ramp-length", type=float, default=None, help="fraction of the steps of the ramp (default: the "
                   "method's)")
    p.add_argument("--kappa-end", type=float, default=None, help="weight of the clean loss after the ramp (default: "
                   "the method's: ibp 0.5, crown-ibp 0)")
    p.add_argument("--train-limit", type=int, default=None, help="first N training images (default: all 60,000)")
    p.add_argument("--test-limit", type=int, default=1000, help="measure on the first N test images (default: 1000)")
    p.add_argument("--pgd-steps", type=int, default=50, help="PGD steps (default: 50; step 2.5 eps / steps)")
    p.add_argument("--pgd-restarts", type=int, default=2, help="PGD restarts (default: 2)")
    p.add_argument("--calibration-batches", type=int, default=8, help="timed batches per phase (default: 8)")
    p.add_argument("--data-dir", default=str(DEFAULT_DATA), help="folder of mnist.npz (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="the JSON file of the figures")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from robustest import data as datasets
    from robustest import models
    from robustest.train import Recipe, harden, harden_settings

    cpu_start = _cpu()
    xtr, ytr = datasets.load("mnist", root=args.data_dir, split="train", limit=args.train_limit).tensors
    xte, yte = datasets.load("mnist", root=args.data_dir, split="test", limit=args.test_limit).tensors
    eps_train = args.eps_train if args.eps_train is not None else EPS_TRAIN.get(round(args.eps, 6), args.eps)
    options = {k: v for k, v in (("ramp_warmup", args.ramp_warmup), ("ramp_length", args.ramp_length),
                                 ("kappa_end", args.kappa_end)) if v is not None}
    kw = {"eps": args.eps, "batch_size": args.batch_size, "recipe": Recipe(lr=args.lr, schedule="cosine"),
          "keep": "last", "seed": args.seed, "eps_train": eps_train, **options}
    s = harden_settings(args.method, epochs=1, **kw)  # checks every option before any work
    torch.manual_seed(args.seed)
    model = models.create("mnist_small")
    steps_per_epoch = -(-int(xtr.shape[0]) // args.batch_size)

    t0 = _cpu()
    n_cal = args.batch_size * (args.calibration_batches + 1)
    phases = time_phases(model, xtr[:n_cal], ytr[:n_cal], s, args.calibration_batches)
    calibration_s = _cpu() - t0
    budget_s = args.minutes * 60.0
    left = budget_s - (_cpu() - cpu_start)
    epochs, per_epoch = plan_epochs(phases, s, steps_per_epoch, left * (1.0 - args.margin), args.max_epochs)
    print(f"{args.method}, eps {args.eps:g} (bounds trained at {eps_train:g}): CPU seconds per batch {phases}; "
          f"{epochs} epochs of {steps_per_epoch} batches planned, {per_epoch:.1f} CPU s each "
          f"({left / 60:.1f} CPU-min left of {args.minutes:g})", flush=True)

    records: list[dict[str, Any]] = []
    costs = epoch_costs(phases, s, steps_per_epoch, epochs)
    train_start = _cpu()

    def on_epoch_end(epoch: int, m: torch.nn.Module, record: dict[str, Any]) -> None:
        used = _cpu() - cpu_start
        records.append({k: record.get(k) for k in ("epoch", "loss", "adv_accuracy", "eps", "kappa", "beta", "lr",
                                                   "seconds")} | {"cpu_s": used})
        print(f"epoch {epoch}/{epochs}: loss {record['loss']:.4f}, certified (train, at {record['eps']:.3f}) "
              f"{record['adv_accuracy']:.4f}, kappa {record['kappa']:.3f}, {used / 60:.1f} CPU-min", flush=True)
        pace = (_cpu() - train_start) / sum(costs[:epoch])  # actual over predicted CPU time so far
        if epoch < epochs and used + pace * costs[epoch] > budget_s:
            raise OutOfBudget

    stopped = False
    try:
        harden(model, (xtr, ytr), args.method, epochs=epochs, on_epoch_end=on_epoch_end, **kw)
    except OutOfBudget:
        stopped = True
    model.eval()
    train_cpu = _cpu() - cpu_start
    figures = measure(model, xte, yte, args.eps, args)
    target = TARGETS.get(round(args.eps, 6))
    res = {
        "settings": {**vars(args), "eps_train": eps_train, "harden": {**s, "epochs": epochs}},
        "train_images": int(xtr.shape[0]), "test_images": int(xte.shape[0]),
        "calibration": {"cpu_s_per_batch": phases, "cpu_s": calibration_s, "predicted_cpu_s_per_epoch": per_epoch},
        "epochs_planned": epochs, "epochs_trained": len(records), "stopped_by_budget": stopped,
        "train_cpu_minutes": train_cpu / 60.0, "figures": figures,
        "target": None if target is None else {"certified_accuracy": target,
                                               "met": figures["certified_accuracy"] >= target
                                               and train_cpu <= 60 * 60.0},
        "epochs": records, "total_cpu_minutes": (_cpu() - cpu_start) / 60.0,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    _print_table(res, args)
    return res


def _print_table(res: dict[str, Any], args: argparse.Namespace) -> None:
    f = res["figures"]
    print()
    print("| method | eps | eps_train | epochs | train CPU-min | clean | PGD | IBP certified | CROWN certified |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.method} | {args.eps:g} | {res['settings']['eps_train']:g} | {res['epochs_trained']} | "
          f"{res['train_cpu_minutes']:.1f} | {f['clean_accuracy']:.3f} | {f['pgd_accuracy']:.3f} | "
          f"{f['ibp_certified_accuracy']:.3f} | {f['crown_certified_accuracy']:.3f} |")
    t = res["target"]
    note = "" if t is None else (f"; target certified >= {t['certified_accuracy']:.2f}: "
                                 f"{'met' if t['met'] else 'MISSED'}")
    print(f"\non the first {res['test_images']} test images, PGD-{args.pgd_steps} x {args.pgd_restarts} restarts; "
          f"{'sound' if f['sound'] else 'NOT SOUND (certified > PGD or PGD > clean)'}{note}"
          + ("; stopped by the budget" if res["stopped_by_budget"] else "")
          + f"; total {res['total_cpu_minutes']:.1f} CPU-min")


if __name__ == "__main__":
    main()
