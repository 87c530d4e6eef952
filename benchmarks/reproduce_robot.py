"""Reproduce RobOT's strategy comparison (Wang et al., ICSE 2021; METHODS.md A4) in one of its settings.

``--setting mnist-lenet5`` (the default without ``--dataset``): MNIST LeNet-5, eps = 0.3, sized for two CPU
cores (the figures in docs/RESULTS.md). The original LeNet-5 is trained 3 epochs on all 60,000 training
images (Adam 1e-3, batch 64); the pool and fine-tuning use the first ``--train-limit`` (10,000) training
images, the fixed set the first ``--test-limit`` (2,000) test images, white-box attacks ``--whitebox-limit``
(300) images; budgets 1, 2, 4, 8 % of the pool; 3 fine-tuning epochs (Adam 1e-3, batch 64; the paper: 10);
seeds 0, 1, 2.

``--setting cifar10-resnet20``: RobOT's CIFAR-10 setting from its reference code (Testing4AI/RobOT,
CIFAR-10/{train_model,gen_adv,select_retrain}.py), for one GPU. ResNet-20 trained with the ``robot-cifar``
recipe (Adam 1e-3, batch 64, 100 epochs, x0.1 after epochs 51, 76 and 91, weight decay 2e-4 off
norms/biases, crop-flip); eps = 0.01; pool = successful FGSM (uniform random start) + PGD (10 steps of
eps/6, random start) examples of all training images (minus the validation split); budgets 1,000, 2,000,
4,000, 6,000 and 10,000 tests; fine-tuning 40 epochs from the original model, Adam 1e-4 x0.1 after epoch
26, batch 64, crop-flip (the reference: random shifts/rotations/flips); fixed set from all 10,000 test
images; white-box on 1,000. Strategies best, kmst, gini (the paper's) and random; seeds 0, 1, 2.
Deviations from the reference code, all deliberate: checkpoints are picked on a validation split of the
training data (the reference picked them on the evaluation set itself), random selection is added,
our ResNet-20 has option-A shortcuts (He et al.) where the Keras model used 1x1 projections.

``--setting digits-cnn``: the built-in 8x8 digits (no files needed), ``digits_cnn`` trained 20 epochs, eps =
0.15 (the demo's), 5 fine-tuning epochs (Adam 1e-3, batch 64), budgets 1, 2, 4, 8 % of the pool, seeds 0-4,
every strategy including the new ones (stratified, fol-prop) and the baselines all and adv-train; white-box on
all 360 test images.

Every flag overrides the setting's value. ``--dataset`` takes any loader name; without ``--setting`` the
setting of that data set is used when there is one (digits, mnist, cifar10), else mnist-lenet5's
(``--dataset npz --data-dir svhn.npz --setting cifar10-resnet20`` runs the CIFAR setting on SVHN).
``--model`` replaces the setting's zoo model; the model is built for the data's channels, size and classes
and refused with one line, before any work, when it cannot take them. ``--dry-run`` swaps in a synthetic
data set of the setting's shape (1x28x28 or 3x32x32, 10 classes, 96 training / 48 test images) and a
handful of steps, to show the whole pipeline works before anyone spends GPU hours.

Resumable: rerun the same command after an interruption. The original model's training keeps a
per-epoch state (OUT/original_state/train_state.pt) and ``robot.compare`` keeps every finished cell (OUT/compare).
Under torchrun only rank 0 writes this script's files.

    python benchmarks/reproduce_robot.py --data-dir ../shared/data --out /tmp/robot-mnist
    python benchmarks/reproduce_robot.py --dataset digits --out /tmp/robot-digits
    python benchmarks/reproduce_robot.py --setting cifar10-resnet20 --data-dir DIR/cifar-10-batches-py \\
        --device cuda --out robot-cifar10
    python benchmarks/reproduce_robot.py --setting cifar10-resnet20 --dry-run --out /tmp/robot-dry
Prints a markdown table (mean ± std over seeds, compute per cell in forward+backward passes), each strategy's
paired difference to random selection with its 95 % t-interval, and the paper's comparison figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _repro import is_rank0, log, rank, synthetic_npz  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "mnist-lenet5": {
        "title": "MNIST LeNet-5", "dataset": "mnist", "model": "lenet5", "shape": (1, 28, 28), "classes": 10,
        "recipe": None, "train_epochs": 3, "eps": 0.3, "train_limit": 10000, "test_limit": 2000,
        "whitebox_limit": 300, "epochs": 3, "lr": 1e-3, "batch_size": 64, "finetune_options": {},
        "budgets": "1%,2%,4%,8%", "strategies": "best,kmst,gini,random", "seeds": "0,1,2", "pgd_steps": 10,
        "apgd_steps": 20,
    },
    "cifar10-resnet20": {
        "title": "CIFAR-10 ResNet-20", "dataset": "cifar10", "model": "resnet20", "shape": (3, 32, 32),
        "classes": 10, "recipe": "robot-cifar", "train_epochs": 100, "eps": 0.01, "train_limit": None,
        "test_limit": None, "whitebox_limit": 1000, "epochs": 40, "lr": 1e-4, "batch_size": 64,
        "finetune_options": {"schedule": "step", "milestones": [26], "augment": "crop-flip"},
        "budgets": "1000,2000,4000,6000,10000", "strategies": "best,kmst,gini,random", "seeds": "0,1,2",
        "pgd_steps": 20, "apgd_steps": 50,
    },
    "digits-cnn": {
        "title": "digits digits_cnn", "dataset": "digits", "model": "digits_cnn", "shape": (1, 8, 8), "classes": 10,
        "recipe": None, "train_epochs": 20, "eps": 0.15, "train_limit": None, "test_limit": None,
        "whitebox_limit": 360, "epochs": 5, "lr": 1e-3, "batch_size": 64, "finetune_options": {},
        "budgets": "1%,2%,4%,8%", "strategies": "best,kmst,gini,random,stratified,fol-prop,all,adv-train",
        "seeds": "0,1,2,3,4", "pgd_steps": 10, "apgd_steps": 20,
    },
}
DRY_RUN = {"n_train": 96, "n_test": 48, "train_epochs": 1, "epochs": 1, "budgets": "10%,20%", "seeds": "0",
           "whitebox_limit": 8, "pgd_steps": 2, "apgd_steps": 2, "train_limit": None, "test_limit": None}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", choices=sorted(SETTINGS), default=None,
                    help="default: the setting of --dataset when there is one, else mnist-lenet5")
    ap.add_argument("--dataset", default=None, help="any robustest.data loader name (default: the setting's)")
    ap.add_argument("--model", default=None, help="zoo model of the original (default: the setting's)")
    ap.add_argument("--data-dir", default=None, help="folder or file holding the data (default: ../shared/data)")
    ap.add_argument("--out", default=None, help="output folder (resumable; default: robot-<setting>)")
    ap.add_argument("--checkpoint", default=None, help="original model (default: train one with the setting's recipe)")
    ap.add_argument("--train-epochs", type=int, default=None, help="epochs for the original model")
    ap.add_argument("--train-limit", type=int, default=None, help="training images for pool + fine-tuning")
    ap.add_argument("--test-limit", type=int, default=None, help="test images for the fixed set and clean acc")
    ap.add_argument("--whitebox-limit", type=int, default=None, help="test images attacked white-box")
    ap.add_argument("--epochs", type=int, default=None, help="fine-tuning epochs per cell")
    ap.add_argument("--budgets", default=None)
    ap.add_argument("--strategies", default=None)
    ap.add_argument("--seeds", default=None)
    ap.add_argument("--eps", type=float, default=None)
    ap.add_argument("--pgd-steps", type=int, default=None, help="white-box PGD steps (2 restarts)")
    ap.add_argument("--apgd-steps", type=int, default=None, help="white-box APGD-CE steps")
    ap.add_argument("--autoattack", choices=("fast", "standard"), default=None,
                    help="add robustest.evaluate's ensemble to every measurement (AutoAttack column; default off)")
    ap.add_argument("--amp", choices=("bf16", "fp16"), default=None, help="mixed precision for training (CUDA)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: LeNet-5 gains little from more, and busy cores punish it)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dry-run", action="store_true",
                    help="synthetic data of the setting's shape and a handful of steps: checks the pipeline")
    args = ap.parse_args(argv)
    if args.setting is None:
        by_data = {v["dataset"]: k for k, v in SETTINGS.items()}
        args.setting = by_data.get(args.dataset, "mnist-lenet5")
    s = SETTINGS[args.setting]
    if args.model is None:
        args.model = s["model"]
    fill = {**s, **(DRY_RUN if args.dry_run else {})}
    for key in ("train_epochs", "train_limit", "test_limit", "whitebox_limit", "epochs", "budgets", "strategies",
                "seeds", "eps", "pgd_steps", "apgd_steps"):
        if getattr(args, key) is None:
            setattr(args, key, fill[key])
    if args.dataset is None:
        args.dataset = s["dataset"]
    if args.data_dir is None and not args.dry_run:
        from robustest import data as datasets

        if datasets.info(args.dataset).needs_root:
            args.data_dir = "../shared/data"
    if args.out is None:
        args.out = f"robot-{args.setting}" + ("-dry" if args.dry_run else "")
    return args


def load_split(args: argparse.Namespace, split: str):
    from robustest import data as datasets

    return datasets.load(args.dataset, root=args.data_dir, split=split)


def train_original(args: argparse.Namespace, s: dict[str, Any], out: Path, ckpt: Path) -> None:
    """Train the setting's model on the whole training split (the setting's recipe), checked against the data
    before any work; per-epoch resume state in OUT/original_state/train_state.pt."""
    from robustest import models as zoo
    from robustest.core.batching import image_shape, labels_of
    from robustest.evaluate import accuracy
    from robustest.models.checkpoints import save_checkpoint
    from robustest.train import fit, recipes

    train = load_split(args, "train")
    test = load_split(args, "test")
    c, h, w = image_shape(train)
    classes = int(max(int(labels_of(train).max()), int(labels_of(test).max())) + 1)
    zoo.check_input(args.model, c, h, max(classes, 2))  # one line naming model and data, before any work
    x, y = train.tensors
    epochs, batch_size, recipe = recipes.layered_recipe(s["recipe"] or None, args.train_epochs,
                                                        {"amp": args.amp} if args.amp else {})
    torch.manual_seed(0)
    model = zoo.create(args.model, num_classes=max(classes, 2), in_channels=c, input_size=h,
                       mean=x.mean(dim=(0, 2, 3)).tolist(), std=x.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist())
    state = out / ("original_state" if rank() == 0 else f"original_state.rank{rank()}")
    dev = torch.device(args.device) if args.device else None
    hist = fit(model, (x, y), epochs, batch_size, recipe, seed=0, progress=False, device=dev, state_dir=state,
               resume=True)
    acc = accuracy(model, test)
    if is_rank0():
        save_checkpoint(ckpt, model, metadata={"dataset": args.dataset, "epochs": args.train_epochs,
                                                        "test_accuracy": acc, "recipe": s["recipe"] or "adam"})
    log(f"trained {args.model} on {len(x)} {args.dataset} images ({args.train_epochs} epochs, "
        f"{hist.seconds:.0f} s): test accuracy {acc:.4f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    s = SETTINGS[args.setting]

    from robustest import data as datasets
    from robustest import models as zoo
    from robustest import robot
    from robustest.core.batching import image_shape
    from robustest.core.errors import ConfigError
    from robustest.models.checkpoints import load_checkpoint

    out = Path(args.out)
    if is_rank0():
        out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        args.dataset = "npz"
        args.data_dir = str(synthetic_npz(out / "synthetic.npz", s["shape"], s["classes"], DRY_RUN["n_train"],
                                          DRY_RUN["n_test"]))
    datasets.canonical(args.dataset)  # an unknown name is one line before any work
    t0 = time.perf_counter()
    ckpt = Path(args.checkpoint) if args.checkpoint else out / f"original_{args.model}.pt"
    if args.checkpoint and not ckpt.is_file():
        raise ConfigError(f"--checkpoint {str(ckpt)!r} does not exist: pass an existing model file")
    if not ckpt.is_file():
        train_original(args, s, out, ckpt)
    model = load_checkpoint(ckpt)
    train = load_split(args, "train")
    c, h, w = image_shape(train)
    spec = getattr(model, "robustest_spec", {}) or {}
    if spec.get("name"):
        zoo.check_input(spec["name"], c, h, spec.get("num_classes"), **(spec.get("options") or {}))
    t_train = time.perf_counter() - t0
    finetune = dict(s["finetune_options"])
    if finetune.get("milestones"):  # the schedule keeps its shape when --epochs changes
        finetune["milestones"] = [m * args.epochs / s["epochs"] for m in finetune["milestones"]]
    if args.amp:
        finetune["amp"] = args.amp
    cfg = {
        "model": str(ckpt), "dataset": args.dataset, "data_dir": args.data_dir, "train_limit": args.train_limit,
        "test_limit": args.test_limit, "eps": args.eps, "pool": "attack", "pool_pgd_steps": 10,
        "strategies": args.strategies.split(","), "budgets": [_budget(b) for b in args.budgets.split(",")],
        "seeds": [int(v) for v in args.seeds.split(",")], "epochs": args.epochs, "batch_size": s["batch_size"],
        "lr": s["lr"], "finetune_options": finetune, "whitebox_limit": args.whitebox_limit,
        "whitebox_pgd_steps": args.pgd_steps, "whitebox_restarts": 2, "apgd_steps": args.apgd_steps,
        "out": str(out / "compare"), "resume": True, "device": args.device,
    }
    if args.autoattack:
        cfg["autoattack"] = args.autoattack
    res = robot.compare(cfg)
    elapsed = time.perf_counter() - t0
    print_tables(res, args, s, elapsed, t_train)
    return 0


def _budget(text: str) -> int | str:
    text = text.strip()
    return int(text) if text.isdigit() else text


def plus_minus(row: dict, m: str) -> str:
    """Mean ± standard deviation over the seeds in %; one seed has no spread: ``mean (n = 1)``."""
    mean, std = row.get(f"{m}_mean"), row.get(f"{m}_std")
    if mean is None:
        return "-"
    if row.get("seeds", 2) < 2 or std is None:
        return f"{100 * mean:.2f} (n = 1)"
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def print_compute(res: dict) -> None:
    """Compute of one cell per strategy (first seed, first budget it ran), split into its parts, in passes."""
    print("\n| strategy | budget | pool generation | selection scoring | fine-tuning | adversarial | total |")
    print("|---|---|---|---|---|---|---|")
    seen = set()
    for c in res["cells"]:
        if c["strategy"] in seen or "compute" not in c:
            continue
        seen.add(c["strategy"])
        k = c["compute"]
        cells = " | ".join("-" if k[p] is None else f"{k[p]:,.0f}" for p in
                           ("pool_generation", "selection_scoring", "finetune", "adversarial", "total"))
        print(f"| {c['strategy']} | {c['budget']} | {cells} |")


def print_paired(res: dict) -> None:
    """Each strategy minus random on the same seed (percentage points): mean [95 % t-interval], * = excludes 0."""
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for p in res.get("paired_vs_random") or []:
        mean, lo, hi = p["mean_diff"], p["ci_low"], p["ci_high"]
        text = "-" if mean is None else (f"{100 * mean:+.2f}" if lo is None else
                                         f"{100 * mean:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]"
                                         + (" *" if lo > 0 or hi < 0 else ""))
        rows.setdefault((str(p["budget"]), p["strategy"]), {})[p["metric"]] = text
        n = p["n_seeds"]
    if not rows:
        return
    print(f"\nPaired vs random (strategy - random on the same seed, points; 95 % t-interval over {n} seeds; "
          "* = excludes 0):\n")
    aa = any("autoattack_accuracy" in m for m in rows.values())
    print("| budget | strategy | fixed-set | white-box |" + (" AutoAttack |" if aa else "") + " clean |")
    print("|---|---|---|---|" + ("---|" if aa else "") + "---|")
    for (b, s), m in rows.items():
        print(f"| {b} | {s} | {m.get('fixed_set_accuracy', '-')} | {m.get('whitebox_accuracy', '-')} | "
              + (f"{m.get('autoattack_accuracy', '-')} | " if aa else "") + f"{m.get('clean_accuracy', '-')} |")


def print_tables(res: dict, args: argparse.Namespace, s: dict[str, Any], elapsed: float, t_train: float) -> None:
    if not is_rank0():
        return
    d = res["data"]
    base = res["baseline"]
    title = s["title"] if (args.dataset, args.model) == (s["dataset"], s["model"]) else f"{args.dataset} {args.model}"
    if args.dry_run:
        title += " (DRY RUN: synthetic data, not a result)"
    print(f"\n{title}, eps {args.eps}: original model clean {100 * base['clean_accuracy']:.2f} %, fixed set "
          f"{100 * base['fixed_set_accuracy']:.2f} % ({d['fixed_set']['size']} examples from {d['num_test']} test "
          f"images), white-box {100 * base['whitebox_accuracy']:.2f} % (first {base['num_whitebox']} test images)"
          + ("" if base.get("autoattack_accuracy") is None else
             f", AutoAttack ({args.autoattack}) {100 * base['autoattack_accuracy']:.2f} %"))
    print(f"pool: {res['pool']['size']} tests {res['pool']['by_method']} from {d['num_fit']} training images; "
          f"validation {d['num_val']} images; {args.epochs} fine-tuning epochs; seeds {args.seeds}; "
          f"total {elapsed / 60:.1f} min (original model {t_train:.0f} s)\n")
    aa = any("autoattack_accuracy_mean" in r for r in res["table"])
    print("| budget | strategy | n | fixed-set acc. (%) | white-box acc. (%) |"
          + (" AutoAttack acc. (%) |" if aa else "") + " clean acc. (%) | last-epoch fixed (%) | passes / cell (k) |")
    print("|---|---|---|---|---|" + ("---|" if aa else "") + "---|---|---|")
    for row in res["table"]:
        last = row.get("last_epoch_fixed_set_accuracy_mean")
        passes = row.get("compute_passes_mean")
        print(f"| {row['budget']} | {row['strategy']} | {row['n']} | {plus_minus(row, 'fixed_set_accuracy')} | "
              f"{plus_minus(row, 'whitebox_accuracy')} | "
              + (f"{plus_minus(row, 'autoattack_accuracy')} | " if aa else "")
              + f"{plus_minus(row, 'clean_accuracy')} | "
              f"{'-' if last is None else f'{100 * last:.2f}'} | {'-' if passes is None else f'{passes / 1e3:.1f}'} |")
    print_compute(res)
    print_paired(res)
    # the paper's two headline figures, computed per budget from the means
    by = {(r["strategy"], str(r["budget"])): r for r in res["table"]}
    strategies = args.strategies.split(",")
    print(f"\n| budget | measure | {' | '.join(strategies)} | best vs gini (relative) |")
    print("|---|---|" + "---|" * len(strategies) + "---|")
    for b in args.budgets.split(","):
        for m, label in (("fixed_set_accuracy", "fixed set"), ("whitebox_accuracy", "white-box")):
            vals = {st: by.get((st, b.strip()), {}).get(f"{m}_mean") for st in strategies}
            rel = "-"
            if vals.get("best") is not None and vals.get("gini"):
                rel = f"{100 * (vals['best'] - vals['gini']) / vals['gini']:+.1f} %"
            cells = " | ".join("-" if v is None else f"{100 * v:.2f}" for v in vals.values())
            print(f"| {b} | {label} | {cells} | {rel} |")
    summary = {"setting": args.setting, "dry_run": args.dry_run, "table": res["table"], "baseline": base,
               "pool": res["pool"], "elapsed_s": elapsed, "settings": vars(args)}
    from robustest.core.atomic import atomic_write_text

    atomic_write_text(Path(args.out, "reproduction.json"), json.dumps(summary, indent=1, default=float))
    means = [r["fixed_set_accuracy_mean"] for r in res["table"] if r["fixed_set_accuracy_mean"] is not None]
    if means:
        print(f"\nmean fixed-set accuracy over all cells: {100 * float(np.mean(means)):.2f} %")


if __name__ == "__main__":
    from robustest.core.errors import ConfigError, DataError

    try:
        sys.exit(main())
    except (ConfigError, DataError) as exc:
        print(f"reproduce_robot: error: {exc}", file=sys.stderr)
        sys.exit(2)
