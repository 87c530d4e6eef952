"""``robustest train``: train a zoo model (or your own pkg.module:factory) on a data set and save a safe
checkpoint.

Writes to --out:
  model.pt      weights + model spec + metadata (loads with torch.load(weights_only=True))
  results.json  settings in effect, per-epoch history, test loss and accuracy, timings, peak memory
                (schema: docs/schemas/train.schema.json)
  report.html   accuracy and loss per epoch, the epoch table, settings and timings
  train_state.pt  with --resume: the state after every epoch, from which a rerun continues

Without recipe flags training is as it always was (Adam 1e-3, batch 64, constant LR, no augmentation);
--recipe fills in a seed's recipe (robustest.train.recipes.RECIPES) and the flags given override it.

Example (AugMix's CIFAR recipe: SGD 0.1, Nesterov, weight decay 5e-4 off norms/biases, cosine, crop-flip):
    robustest train --dataset cifar10 --data-dir DIR --model wrn-40-2 --recipe cifar-sgd --amp bf16 \\
        --device cuda --resume --out wrn40
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

import torch

from robustest import models as zoo
from robustest.cli.args import (
    add_data_args,
    add_option_args,
    add_run_args,
    json_object,
    key_value,
    model_options_object,
    positive_int,
)
from robustest.cli.loading import check_fits, load_data
from robustest.cli.output import log, out_dir, write_run, written
from robustest.cli.settings import data_settings
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError
from robustest.train.recipes import RECIPES, Recipe, check_device, layered_recipe

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
    p.add_argument("--model-option", dest="model_option", action="append", type=key_value, default=None,
                   metavar="KEY=VALUE", help="a zoo model option, e.g. dropout=0.3, patch=8, growth=12, depth=16, "
                                             "width=4 (repeatable; robustest info --models lists the models)")
    p.add_argument("--model-options", type=model_options_object, default=None, metavar="JSON",
                   help="zoo model options as a JSON object, e.g. '{\"dropout\": 0.3}'")
    p.add_argument("--epochs", type=positive_int, default=None, help="training epochs (required unless --recipe)")
    p.add_argument("--no-normalize", action="store_true",
                   help="do not put the training set's per-channel mean/std inside the model")
    g = p.add_argument_group("training recipe (defaults: Adam 1e-3, batch 64, constant LR, no augmentation; "
                             "--recipe fills in a seed's recipe, the flags given override it)")
    g.add_argument("--recipe", choices=sorted(RECIPES), default=None,
                   help="robot-cifar (RobOT's ResNet-20: Adam, steps at 50/75/90 %%), cifar-sgd (AugMix's WRN: SGD "
                        "0.1 Nesterov, cosine), imagenet-sgd (AugMix's ResNet-50: SGD 0.1, steps at 1/3, 2/3); "
                        "milestones scale with --epochs")
    g.add_argument("--batch-size", type=positive_int, default=None, help="batch size (default: 64)")
    add_option_args(g, Recipe, unset=True)
    g.add_argument("--resume", action="store_true",
                   help="save OUT/train_state.pt after every epoch and continue from it if it is there")
    add_run_args(p)
    p.set_defaults(func=run)


def _model_name(text: str) -> str:
    """A zoo model (parameterised ones included, e.g. wrn-28-10) or pkg.module:factory."""
    if ":" in text:
        return text
    try:
        zoo.resolve_name(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or pkg.module:factory for your own code)") from None
    return text


def resolve_recipe(args: argparse.Namespace) -> tuple[int, int, Recipe]:
    """(epochs, batch size, validated options) from --recipe and the flags given (which override it:
    :func:`robustest.train.recipes.layered_recipe`); written back into ``args`` so results.json records what ran."""
    names = ("batch_size", *(f.name for f in dataclasses.fields(Recipe)))
    epochs, batch_size, opts = layered_recipe(args.recipe, args.epochs, {k: getattr(args, k) for k in names
                                                                          if getattr(args, k) is not None})
    for k, v in {**opts.to_dict(), "batch_size": batch_size, "epochs": epochs}.items():
        setattr(args, k, v)
    return epochs, batch_size, opts


def _zoo_options(args: argparse.Namespace) -> dict[str, Any]:
    """--model-option KEY=VALUE and --model-options JSON merged and checked against the model's options."""
    given = dict(args.model_options or {})
    for key, value in args.model_option or []:
        if key in given and given[key] != value:
            raise ConfigError(f"model option {key} is given twice ({given[key]!r} and {value!r}): drop one")
        given[key] = value
    if not given:
        return {}
    if ":" in args.model:
        raise ConfigError("--model-option/--model-options apply to zoo models; pass keyword arguments of "
                          "pkg.module:factory with --model-args")
    return zoo.check_options(args.model, given)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from robustest.models.checkpoints import load_model
    from robustest.train.fit_report import fit_report
    from robustest.train.train_pipeline import sized_zoo_model, train_pipeline

    if Path(args.out).exists():
        out_dir(args)  # a file in the way is a one-line error before any work; the folder is made after checks
    device = resolve_device(None, args.device) if args.device else torch.device("cpu")
    epochs, batch_size, opts = resolve_recipe(args)
    check_device(opts, device)
    model_opts = _zoo_options(args)
    t0 = time.perf_counter()
    train = load_data(args, "train")
    test = load_data(args, "test")
    t_data = time.perf_counter() - t0
    torch.manual_seed(args.seed)
    if ":" in args.model:
        model = load_model(factory=args.model, factory_args=args.model_args, map_location=device)
    elif args.model_args is not None:
        raise ConfigError("--model-args applies to a pkg.module:factory --model, not to zoo models: use "
                          "--model-option KEY=VALUE")
    else:
        model = sized_zoo_model(args.model, train, test, num_classes=args.num_classes,
                                normalize=not args.no_normalize, options=model_opts, seed=args.seed, device=device)
    check_fits(model, train)
    out = out_dir(args)
    trun = train_pipeline(model, train, test, out=out, epochs=epochs, batch_size=batch_size, recipe=opts,
                          recipe_name=args.recipe, seed=args.seed, device=device, progress=not args.no_progress,
                          resume=bool(args.resume), metadata={"dataset": args.dataset},
                          note=lambda text: log.warning(f"{args.dataset} data at {args.data_dir}: {text}"))
    settings = {**data_settings(args), "model": args.model, **({"model_args": args.model_args}
                                                                if args.model_args is not None else {}),
                **({"model_options": model_opts} if model_opts else {}),
                **({"recipe": args.recipe} if args.recipe else {}),
                "epochs": epochs, "batch_size": batch_size, **opts.in_effect(), "seed": args.seed,
                "device": str(device), **({"resume": True} if args.resume else {}),
                **({"normalize": not args.no_normalize} if ":" not in args.model else {})}
    doc = write_run(out, "train", t0, settings, trun.to_results(), {"load_data_s": t_data, **trun.timings},
                    lambda doc: fit_report(doc, args.model, args.dataset))
    log.info(trun.summary_line(args.model, args.dataset))
    written(out, doc["files"], t0)
    return 0
