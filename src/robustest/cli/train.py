"""``robustest train``: train a zoo model (or your own pkg.module:factory) on a data set and save a safe
checkpoint.

Writes to --out:
  model.pt      weights + model spec + metadata (loads with torch.load(weights_only=True))
  results.json  settings in effect, per-epoch history, test loss and accuracy, timings, peak memory
                (schema: docs/schemas/train.schema.json)
  report.html   accuracy and loss per epoch, the epoch table, settings and timings
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from robustest import models as zoo
from robustest.checkpoints import source_of
from robustest.cli._common import (
    add_data_args,
    add_run_args,
    check_fits,
    data_settings,
    fmt,
    json_object,
    load_data,
    log,
    non_negative_float,
    out_dir,
    peak_rss_mib,
    positive_float,
    positive_int,
)
from robustest.errors import ConfigError
from robustest.results import write_results
from robustest.runtime import image_shape, labels_of, resolve_device, take
from robustest.training import channel_stats

ORDER = 10


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model and save a checkpoint", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_args(p, split=None)
    p.add_argument("--model", required=True, type=_model_name, metavar="NAME",
                   help=f"zoo architecture ({', '.join(zoo.names())}) or pkg.module:factory, your own code "
                        "(imported from PYTHONPATH or the current folder: this RUNS YOUR CODE)")
    p.add_argument("--model-args", type=json_object, default=None, metavar="JSON",
                   help="keyword arguments for a pkg.module:factory --model, as a JSON object")
    p.add_argument("--epochs", type=positive_int, required=True, help="training epochs")
    p.add_argument("--batch-size", type=positive_int, default=64, help="batch size (default: 64)")
    p.add_argument("--lr", type=positive_float, default=1e-3, help="learning rate (default: 1e-3)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="optimizer (default: adam)")
    p.add_argument("--weight-decay", type=non_negative_float, default=0.0, help="weight decay (default: 0)")
    p.add_argument("--schedule", choices=("none", "cosine", "step"), default="none", help="LR schedule")
    p.add_argument("--no-normalize", action="store_true",
                   help="do not put the training set's per-channel mean/std inside the model")
    add_run_args(p)
    p.set_defaults(func=run)


def _same_data(a, b) -> bool:
    """Whether two splits hold the same data (same size, labels and first images): a folder without splits."""
    if len(a) != len(b):
        return False
    la, lb = labels_of(a), labels_of(b)
    if la is not None and lb is not None and not torch.equal(la, lb):
        return False
    k = torch.arange(min(len(a), 64))
    return bool(torch.equal(take(a, k)[0], take(b, k)[0]))


def _model_name(text: str) -> str:
    """A zoo model (parameterised ones included, e.g. wrn-28-10) or pkg.module:factory."""
    if ":" in text:
        return text
    try:
        zoo.resolve_name(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or pkg.module:factory for your own code)") from None
    return text


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from robustest.training import evaluate, fit, save_checkpoint

    if Path(args.out).exists():
        out_dir(args)  # a file in the way is a one-line error before any work; the folder is made after checks
    device = resolve_device(None, args.device) if args.device else torch.device("cpu")
    t0 = time.perf_counter()
    train = load_data(args, "train")
    test = load_data(args, "test")
    same_split = _same_data(train, test)
    if same_split:
        log.warning(f"{args.dataset} data at {args.data_dir} has no separate test split; the reported test "
                    "accuracy is measured on the training data")
    t_data = time.perf_counter() - t0
    torch.manual_seed(args.seed)
    if ":" in args.model:
        from robustest.checkpoints import load_model

        model = load_model(factory=args.model, factory_args=args.model_args, map_location=device)
    else:
        if args.model_args is not None:
            raise ConfigError("--model-args applies to a pkg.module:factory --model, not to zoo models")
        c, h, w = image_shape(train)
        if h != w:
            raise ConfigError(f"images must be square for the zoo models, got {h}x{w}: pass --resize H W")
        y_tr, y_te = labels_of(train), labels_of(test)
        num_classes = args.num_classes or int(max(int(y_tr.max()), int(y_te.max())) + 1)
        mean = std = None
        if not args.no_normalize:
            mean, std = channel_stats(train)
        model = zoo.create(args.model, num_classes=max(num_classes, 2), in_channels=c, input_size=h, mean=mean,
                           std=std).to(device)
    check_fits(model, train)
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
    settings = {**data_settings(args), "model": args.model, **({"model_args": args.model_args}
                                                                if args.model_args is not None else {}),
                "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr, "optimizer": args.optimizer,
                "weight_decay": args.weight_decay, "schedule": args.schedule, "seed": args.seed,
                "device": str(device)}
    if ":" not in args.model:
        settings["normalize"] = not args.no_normalize
    results = {
        "model": source_of(model),
        "num_train": len(train),
        "num_test": len(test),
        "history": history.to_dict(),
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "test_split_is_training_data": same_split,
        "peak_rss_mib": peak_rss_mib(),
        "files": {"model": "model.pt", "report": "report.html"},
    }
    timings = {"load_data_s": t_data, "train_s": history.seconds, "eval_s": t_eval,
               "total_s": time.perf_counter() - t0}
    doc = write_results(out, "train", settings, results, timings)
    _report(doc, args).write(out / "report.html")
    last = history.last
    log.info(f"trained {args.model} on {args.dataset}: {len(train)} images, {args.epochs} epochs, "
             f"train loss {fmt(last.loss)}, train accuracy {fmt(last.accuracy, 'accuracy')}, "
             f"test accuracy {fmt(test_acc, 'accuracy')} ({fmt(history.seconds, 'train_s')} s)")
    log.info(f"wrote {out / 'model.pt'}, results.json and report.html")
    return 0


def _report(doc: dict[str, Any], args: argparse.Namespace):
    """report.html of a training run: summary, accuracy and loss per epoch, the epoch table."""
    from robustest.report import HtmlReport, save_lines

    rep = HtmlReport.from_results(doc, f"robustest train: {args.model} on {args.dataset}")
    epochs = doc["history"]["epochs"]
    rep.key_values({"model": doc["model"].get("name") or doc["model"].get("factory") or doc["model"].get("kind"),
                    "num_train": doc["num_train"], "num_test": doc["num_test"], "epochs": len(epochs),
                    "test_accuracy": doc["test_accuracy"], "test_loss": doc["test_loss"],
                    "best_epoch": doc["history"].get("best_epoch")})
    if doc["test_split_is_training_data"]:
        rep.note("The data has no separate test split: the test figures are measured on the training data.")
    if epochs:
        xs = [e["epoch"] for e in epochs]
        for key, label in (("accuracy", "accuracy"), ("loss", "loss")):
            series = {f"train {label}": (xs, [e[key] for e in epochs])}
            if all(e.get(f"val_{key}") is not None for e in epochs):
                series[f"validation {label}"] = (xs, [e[f"val_{key}"] for e in epochs])
            rep.image(save_lines(series, None, title=f"{label} per epoch", xlabel="epoch", ylabel=label),
                      f"Training {label} per epoch.")
        rep.heading("Epochs")
        cols = [c for c in ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "lr", "seconds")
                if any(e.get(c) is not None for e in epochs)]
        rep.table(epochs, cols)
    return rep
