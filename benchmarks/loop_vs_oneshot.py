"""The RobOT loop against one-shot selection (equal tests and epochs) and against adversarial training (equal
compute), on the built-in digits data (no files needed).

Per seed, from ONE original model (``digits_cnn`` trained ``--train-epochs`` on all digits training images,
seed 0) and the seed's own validation split, fixed adversarial set and white-box attack seeds:

* ``loop``: ``robustest run`` with ``--rounds`` R rounds; every round generates a fresh FGSM+PGD pool against
  the CURRENT model, selects ``--n`` tests with the strategy and fine-tunes ``--epochs-per-round`` E epochs on
  the training data + all tests selected so far (the convergence rule is switched off: patience R + 1).
* ``oneshot``: ``robustest compare``: one pool against the ORIGINAL model, R x n tests selected once with the
  same strategy, fine-tuned R x E epochs: the same number of tests and of epochs.
* ``adv-train``: PGD adversarial training (Madry et al.; ``robustest.train.hardening``'s pgd-at) from the original
  model for the number of epochs whose forward+backward passes come closest to the loop's (random strategy,
  first seed; ``--adv-epochs`` fixes it instead): equal compute.
* ``adv-train-oneshot``: the same, with the epochs whose passes come closest to a one-shot cell's (random,
  first seed): adversarial training at the one-shot selection's compute.

Compute is counted by :class:`robustest.core.compute.PassCounter` per cell (pool generation, selection scoring,
fine-tuning, adversarial generation; the loop summed over its rounds; measuring robustness and the loop's
convergence probe are not counted). The paired differences (same seed) and their 95 % t-intervals come from
:func:`robustest.robot.paired_vs_random`, with the reference arm in random's place.

    python benchmarks/loop_vs_oneshot.py --out /tmp/loop16 --threads 1

Resumable: rerun the same command; every finished loop round and compare cell is kept under OUT. Prints
markdown tables and writes OUT/loop_vs_oneshot.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

METRICS = ("fixed_set_accuracy", "whitebox_accuracy", "clean_accuracy")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (resumable)")
    ap.add_argument("--seeds", default="0,1,2,3,4,5,6,7")
    ap.add_argument("--strategies", default="random,stratified,kcenter",
                    help="selection strategies run both in the loop and one-shot")
    ap.add_argument("--rounds", type=int, default=4, help="loop rounds R")
    ap.add_argument("--n", type=int, default=32, help="tests selected per loop round (one-shot: R x n)")
    ap.add_argument("--epochs-per-round", type=int, default=2,
                    help="loop fine-tuning epochs per round (one-shot: R x E)")
    ap.add_argument("--adv-epochs", type=int, default=None,
                    help="adv-train epochs (default: matched to the loop's compute)")
    ap.add_argument("--eps", type=float, default=0.15)
    ap.add_argument("--train-epochs", type=int, default=20)
    ap.add_argument("--whitebox-limit", type=int, default=360)
    ap.add_argument("--pgd-steps", type=int, default=10, help="white-box PGD steps (2 restarts)")
    ap.add_argument("--apgd-steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--autoattack", choices=("fast", "standard"), default=None,
                    help="also measure every model under robustest eval's ensemble (an AutoAttack column)")
    return ap.parse_args(argv)


def metrics(args: argparse.Namespace) -> tuple[str, ...]:
    return METRICS + (("autoattack_accuracy",) if args.autoattack else ())


def original_model(out: Path, train_epochs: int) -> Path:
    """Train (once) digits_cnn on all digits training images, seed 0, as benchmarks/reproduce_robot.py does."""
    from robustest import data as datasets
    from robustest import models as zoo
    from robustest.models.checkpoints import save_checkpoint
    from robustest.train import fit

    ckpt = out / "original_digits_cnn.pt"
    if ckpt.is_file():
        return ckpt
    train = datasets.load("digits", split="train")
    x, y = train.tensors
    torch.manual_seed(0)
    model = zoo.create("digits_cnn", num_classes=10, in_channels=1, input_size=8,
                       mean=x.mean(dim=(0, 2, 3)).tolist(), std=x.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist())
    fit(model, (x, y), epochs=train_epochs, seed=0, progress=False)
    save_checkpoint(ckpt, model, metadata={"dataset": "digits", "epochs": train_epochs})
    return ckpt


def base_config(args: argparse.Namespace, ckpt: Path, seed: int) -> dict[str, Any]:
    return {"model": str(ckpt), "dataset": "digits", "eps": args.eps, "pool": "attack", "pool_pgd_steps": 10,
            "batch_size": 64, "lr": 1e-3, "whitebox_limit": args.whitebox_limit,
            "whitebox_pgd_steps": args.pgd_steps, "whitebox_restarts": 2, "apgd_steps": args.apgd_steps,
            "seed": seed, "resume": True, "verbose": False, "convergence_probe": 200,
            **({"autoattack": args.autoattack} if args.autoattack else {})}


def loop_cell(args: argparse.Namespace, ckpt: Path, strategy: str, seed: int, out: Path) -> dict[str, Any]:
    """One loop run as a comparison cell: the last round's robustness, the compute summed over rounds."""
    from robustest import robot

    res = robot.run({**base_config(args, ckpt, seed), "strategy": strategy, "budget": args.n,
                     "rounds": args.rounds, "epochs": args.epochs_per_round,
                     "convergence_patience": args.rounds + 1, "out": str(out / "loop" / strategy / f"s{seed}")})
    rounds = res["rounds"]
    totals = [r["compute"]["total"] for r in rounds]
    return {"arm": "loop", "strategy": strategy, "seed": seed, "n": res["num_selected_total"],
            "epochs": args.epochs_per_round * len(rounds), "robustness": rounds[-1]["robustness"],
            "compute": None if None in totals else float(sum(totals)), "baseline": res["baseline"],
            "per_round": [{m: r["robustness"][m] for m in metrics(args)} for r in rounds]}


def compare_cells(args: argparse.Namespace, ckpt: Path, strategies: list[str], seed: int, epochs: int, budget: int,
                  out: Path, arm: str) -> list[dict[str, Any]]:
    from robustest import robot

    res = robot.compare({**base_config(args, ckpt, seed), "strategies": strategies, "budgets": [budget],
                         "seeds": [seed], "epochs": epochs, "out": str(out)})
    return [{"arm": arm, "strategy": c["strategy"], "seed": seed, "n": c["n"], "epochs": epochs,
             "robustness": c["robustness"], "compute": (c.get("compute") or {}).get("total"),
             "baseline": res["baseline"]} for c in res["cells"]]


def paired(test: list[dict[str, Any]], ref: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``test - ref`` paired by seed per metric: mean and 95 % t-interval (robot.paired_vs_random, ref as random)."""
    from robustest.robot import paired_vs_random

    cells = [{**c, "strategy": "random", "budget": "b"} for c in ref] + \
            [{**c, "strategy": "test", "budget": "b"} for c in test]
    return {r["metric"]: r for r in paired_vs_random(cells)}


def plus_minus(cells: list[dict[str, Any]], m: str) -> str:
    v = [100 * c["robustness"][m] for c in cells]
    return f"{np.mean(v):.2f} ± {np.std(v, ddof=1) if len(v) > 1 else 0.0:.2f}"


def _diff(p: dict[str, Any] | None) -> str:
    if p is None:
        return "-"
    mean, lo, hi = 100 * p["mean_diff"], p["ci_low"], p["ci_high"]
    if lo is None:
        return f"{mean:+.1f}"
    star = " *" if lo > 0 or hi < 0 else ""
    return f"{mean:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]{star}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ms = metrics(args)
    aa = bool(args.autoattack)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    strategies = [s.strip() for s in args.strategies.split(",")]
    t0 = time.perf_counter()
    ckpt = original_model(out, args.train_epochs)
    total_n, total_e = args.rounds * args.n, args.rounds * args.epochs_per_round
    cells: list[dict[str, Any]] = []
    adv_epochs, adv_epochs_small = args.adv_epochs, None
    for sd in seeds:
        for s in strategies:
            cells.append(loop_cell(args, ckpt, s, sd, out))
            print(f"seed {sd} loop {s}: {json.dumps({m: round(cells[-1]['robustness'][m], 4) for m in ms})}"
                  f" passes {cells[-1]['compute']:,.0f} ({(time.perf_counter() - t0) / 60:.1f} min)", flush=True)
        cells += compare_cells(args, ckpt, strategies, sd, total_e, total_n, out / "oneshot" / f"s{sd}", "oneshot")
        print(f"seed {sd} one-shot done ({(time.perf_counter() - t0) / 60:.1f} min)", flush=True)
        if adv_epochs is None:  # calibrate once: passes of one adv-train epoch against the loop's (random) total
            one = compare_cells(args, ckpt, ["adv-train"], sd, 1, total_n, out / "adv-calibration", "calibration")[0]
            target = next(c["compute"] for c in cells if c["arm"] == "loop" and c["strategy"] == strategies[0])
            adv_epochs = max(1, int(round(target / one["compute"])))
            print(f"adv-train: {one['compute']:,.0f} passes per epoch, loop {target:,.0f}: {adv_epochs} epochs",
                  flush=True)
        if adv_epochs_small is None:
            one = compare_cells(args, ckpt, ["adv-train"], seeds[0], 1, total_n, out / "adv-calibration",
                                "calibration")[0]
            target = next(c["compute"] for c in cells if c["arm"] == "oneshot" and c["strategy"] == strategies[0])
            adv_epochs_small = max(1, int(round(target / one["compute"])))
            print(f"adv-train at one-shot compute ({target:,.0f} passes): {adv_epochs_small} epochs", flush=True)
        small = compare_cells(args, ckpt, ["adv-train"], sd, adv_epochs_small, total_n,
                              out / "adv-train-oneshot" / f"s{sd}", "adv-train-oneshot")
        cells += [{**c, "strategy": "adv-train"} for c in small]
        cells += compare_cells(args, ckpt, ["adv-train"], sd, adv_epochs, total_n, out / "adv-train" / f"s{sd}",
                               "adv-train")
    elapsed = time.perf_counter() - t0

    base = cells[0]["baseline"]
    print(f"\ndigits digits_cnn, eps {args.eps}, seeds {args.seeds}: original clean "
          f"{100 * base['clean_accuracy']:.2f} %, white-box {100 * base['whitebox_accuracy']:.2f} %; "
          f"loop {args.rounds} rounds x {args.n} tests x {args.epochs_per_round} epochs; "
          f"one-shot {total_n} tests x {total_e} epochs; "
          f"adv-train {adv_epochs} epochs (at one-shot compute: {adv_epochs_small}); {elapsed / 60:.1f} min\n")
    print("| arm | strategy | tests | epochs | fixed-set | white-box |" + (" AutoAttack |" if aa else "") +
          " clean | passes / cell |")
    print("|---|---|---|---|---|---|---|---|" + ("---|" if aa else ""))
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["arm"], c["strategy"]), []).append(c)
    for (arm, s), cs in groups.items():
        passes = [c["compute"] for c in cs]
        ptxt = "-" if None in passes else f"{np.mean(passes):,.0f}"
        print(f"| {arm} | {s} | {cs[0]['n']} | {cs[0]['epochs']} | {plus_minus(cs, 'fixed_set_accuracy')} | "
              f"{plus_minus(cs, 'whitebox_accuracy')} | "
              + (f"{plus_minus(cs, 'autoattack_accuracy')} | " if aa else "") +
              f"{plus_minus(cs, 'clean_accuracy')} | {ptxt} |")
    comparisons = []
    for s in strategies:
        comparisons.append((f"loop {s} - one-shot {s}", groups[("loop", s)], groups[("oneshot", s)]))
    for s in strategies:
        comparisons.append((f"loop {s} - adv-train", groups[("loop", s)], groups[("adv-train", "adv-train")]))
    for s in strategies:
        comparisons.append((f"one-shot {s} - adv-train at one-shot compute", groups[("oneshot", s)],
                            groups[("adv-train-oneshot", "adv-train")]))
    for arm in ("loop", "oneshot"):
        for s in strategies[1:]:
            comparisons.append((f"{arm} {s} - {arm} {strategies[0]}", groups[(arm, s)], groups[(arm, strategies[0])]))
    print("\nPaired differences (points, same seed; mean [95 % t-interval]; * = excludes 0):\n")
    print("| comparison | fixed-set | white-box |" + (" AutoAttack |" if aa else "") + " clean |")
    print("|---|---|---|---|" + ("---|" if aa else ""))
    summary_pairs = []
    for label, a, b in comparisons:
        p = paired(a, b)
        summary_pairs.append({"comparison": label, **{m: p.get(m) for m in ms}})
        print(f"| {label} | {_diff(p.get('fixed_set_accuracy'))} | {_diff(p.get('whitebox_accuracy'))} | "
              + (f"{_diff(p.get('autoattack_accuracy'))} | " if aa else "") + f"{_diff(p.get('clean_accuracy'))} |")
    print("\nLoop, per round (mean over seeds, %): fixed-set / white-box / clean" + (" / AutoAttack" if aa else ""))
    for s in strategies:
        per = groups[("loop", s)]
        rows = [" / ".join(f"{100 * np.mean([c['per_round'][r][m] for c in per]):.1f}" for m in ms)
                for r in range(min(len(c["per_round"]) for c in per))]
        print(f"  {s}: " + "  |  ".join(f"round {i + 1}: {t}" for i, t in enumerate(rows)))
    from robustest.core.atomic import atomic_write_text

    atomic_write_text(out / "loop_vs_oneshot.json", json.dumps(
        {"settings": vars(args), "adv_epochs": adv_epochs, "adv_epochs_oneshot": adv_epochs_small, "elapsed_s": elapsed,
         "cells": [{k: v for k, v in c.items() if k != "baseline"} for c in cells], "baseline": base,
         "paired": summary_pairs}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
