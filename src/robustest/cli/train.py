"""``robustest train``: train a zoo model on a data set and save a safe checkpoint.

Writes ``OUT/model.pt`` (weights + model spec + metadata, loads with weights_only=True) and
``OUT/train.json`` (arguments, per-epoch history, test accuracy, timings, peak memory).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from robustest import models as zoo
from robustest.cli._common import (
    add_data_args,
    add_run_args,
    load_data,
    model_name,
    out_dir,
    peak_rss_mib,
    positive_float,
    positive_int,
)
from robustest.runtime import atomic_write_json, resolve_device

ORDER = 10


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model and save a checkpoint", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_args(p, split=None)
    p.add_argument("--model", required=True, type=model_name, metavar="NAME",
                   help="model architecture: " + ", ".join(zoo.names()) + " (wrn as wrn-D-K, e.g. wrn-28-10); "
                   "'robustest info' lists them with their sizes")
    p.add_argument("--epochs", type=positive_int, required=True, help="training epochs")
    p.add_argument("--batch-size", type=positive_int, default=64, help="batch size (default: 64)")
    p.add_argument("--lr", type=positive_float, default=1e-3, help="learning rate (default: 1e-3)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="optimizer (default: adam)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="weight decay (default: 0)")
    p.add_argument("--schedule", choices=("none", "cosine", "step"), default="none", help="LR schedule")
    p.add_argument("--no-normalize", action="store_true",
                   help="do not put the training set's per-channel mean/std inside the model")
    add_run_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from robustest.training import evaluate, fit, save_checkpoint

    if Path(args.out).exists():
        out_dir(args)  # a file in the way is a one-line error before any work; the folder is made after checks
    device = resolve_device(None, args.device) if args.device else torch.device("cpu")
    t0 = time.perf_counter()
    train = load_data(args, "train")
    test = load_data(args, "test")
    same_split = len(test) == len(train) and torch.equal(test.tensors[0], train.tensors[0])
    if same_split:
        print(f"note: {args.dataset} data at {args.data_dir} has no separate test split; the reported test "
              "accuracy is measured on the training data", file=sys.stderr)
    t_data = time.perf_counter() - t0
    x, y = train.tensors
    num_classes = int(max(int(y.max()), int(test.tensors[1].max())) + 1)
    mean = std = None
    if not args.no_normalize:
        mean = x.mean(dim=(0, 2, 3)).tolist()
        std = x.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist()
    if x.shape[2] != x.shape[3]:
        from robustest.errors import ConfigError

        raise ConfigError(f"images must be square for the zoo models, got {x.shape[2]}x{x.shape[3]}")
    torch.manual_seed(args.seed)
    model = zoo.create(args.model, num_classes=max(num_classes, 2), in_channels=x.shape[1],
                       input_size=x.shape[2], mean=mean, std=std).to(device)
    out = out_dir(args)
    history = fit(model, train, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                  optimizer=args.optimizer, weight_decay=args.weight_decay,
                  schedule=None if args.schedule == "none" else args.schedule, seed=args.seed,
                  device=device, progress=not args.no_progress)
    t1 = time.perf_counter()
    test_loss, test_acc = evaluate(model, test)
    t_eval = time.perf_counter() - t1
    meta = {"dataset": args.dataset, "epochs": args.epochs, "test_accuracy": test_acc, "seed": args.seed}
    save_checkpoint(out / "model.pt", model, metadata=meta)
    report = {
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "model": zoo.spec_of(model),
        "num_train": len(train),
        "num_test": len(test),
        "history": history.to_dict(),
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "test_split_is_training_data": same_split,
        "timings": {"load_data_s": t_data, "train_s": history.seconds, "eval_s": t_eval,
                    "total_s": time.perf_counter() - t0},
        "peak_rss_mib": peak_rss_mib(),
        "device": str(device),
    }
    atomic_write_json(out / "train.json", report)
    last = history.last
    print(f"trained {args.model} on {args.dataset}: {len(train)} images, {args.epochs} epochs, "
          f"train loss {last.loss:.4f}, train acc {last.accuracy:.4f}, test acc {test_acc:.4f} "
          f"({history.seconds:.1f}s)")
    print(f"wrote {out / 'model.pt'} and {out / 'train.json'}")
    return 0
