"""What a verb loads: the data set and the model its arguments name, checked against each other before any work,
and the batch size (``auto``: the largest that fits the device)."""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from robustest import data as datasets
from robustest.cli.args import LOADER_FLAGS, options_from_args
from robustest.cli.output import log
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError

__all__ = ["build_zoo_model", "check_fits", "load_checked", "load_data", "load_model", "model_options",
           "resolve_batch_size"]


def resolve_batch_size(args: argparse.Namespace, model: nn.Module, data: Any, *, default: int, grad: bool,
                       amp: str | None = None) -> int:
    """Replace ``args.batch_size`` ``auto`` by the size :func:`robustest.core.batchsize.auto_batch_size` picks for
    ``model`` and ``data`` (``args.batch_size_auto`` then True: the settings record both); returns it."""
    from robustest.core.batchsize import AUTO, auto_batch_size

    args.batch_size_auto = args.batch_size == AUTO
    args.batch_size = auto_batch_size(args.batch_size, model, data, default=default, grad=grad, amp=amp)
    if args.batch_size_auto:
        log.info(f"--batch-size auto: {args.batch_size}")
    return int(args.batch_size)


def load_data(args: argparse.Namespace, split: str | None = None) -> Dataset:
    """Load the data set named by --dataset/--data-dir for ``split`` (default --split) with the loader options
    (--limit applied before decoding); images stay compact and are streamed per batch."""
    return datasets.load(args.dataset, root=args.data_dir, split=split or args.split,
                         **options_from_args(datasets.LoadOptions, args, LOADER_FLAGS))


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The model options as keyword arguments of :func:`robustest.models.checkpoints.load_model`."""
    return {"source": getattr(args, "checkpoint", None), "factory": getattr(args, "model_factory", None),
            "factory_args": getattr(args, "model_args", None), "weights": getattr(args, "weights", None),
            "torchscript": bool(getattr(args, "torchscript", False))}


def load_model(args: argparse.Namespace) -> nn.Module:
    """The model named by the model options (refusing unsafe files), on --device."""
    from robustest.models.checkpoints import load_model as load

    opts = model_options(args)
    if opts["factory_args"] is not None and opts["factory"] is None:
        raise ConfigError("--model-args applies to --model pkg.module:factory")
    if opts["source"] is None and opts["factory"] is None and opts["weights"] is None:
        raise ConfigError("no model given: pass --checkpoint FILE, or --model pkg.module:factory --weights FILE for "
                          "your own model")
    random_init = bool(getattr(args, "random_init", False))
    if random_init and (opts["source"] is not None or opts["weights"] is not None):
        raise ConfigError("--random-init/--from-scratch starts from random weights: drop --checkpoint/--weights, or "
                          "drop --random-init to use them")
    if random_init and opts["factory"] is None:
        raise ConfigError("--random-init/--from-scratch needs --model NAME (or pkg.module:factory) to build")
    if random_init:
        torch.manual_seed(getattr(args, "seed", 0) or 0)  # the initial weights come from --seed
    device = resolve_device(None, args.device) if getattr(args, "device", None) else torch.device("cpu")
    model = load(**opts, map_location=device)  # a bad factory or its arguments: refused here first
    if opts["factory"] is not None and opts["source"] is None and opts["weights"] is None and not random_init:
        raise ConfigError(f"--model {opts['factory']} without --weights or --checkpoint would run random weights: "
                          "give --weights FILE, or --random-init if that is what you want")
    return model


def build_zoo_model(args: argparse.Namespace, data: Any) -> nn.Module:
    """The zoo model --model NAME with random weights (seeded by --seed), sized from ``data``: its channels,
    square side and number of classes (--num-classes, or the largest label + 1). Needs --from-scratch; no
    normalisation layer (inputs in [0, 1] as they are), on --device."""
    name = args.model_factory
    if not getattr(args, "random_init", False):
        raise ConfigError(f"--model {name} is a zoo architecture with random weights: add --from-scratch to train "
                          "it from scratch, or fine-tune a trained model with --checkpoint FILE")
    if args.checkpoint is not None or args.weights is not None:
        raise ConfigError("--from-scratch starts from random weights: drop --checkpoint/--weights")
    if args.model_args is not None:
        raise ConfigError("--model-args applies to --model pkg.module:factory, not to zoo models")
    from robustest.train.train_pipeline import sized_zoo_model

    device = resolve_device(None, args.device) if getattr(args, "device", None) else torch.device("cpu")
    return sized_zoo_model(name, data, data, num_classes=getattr(args, "num_classes", None), normalize=False,
                           seed=getattr(args, "seed", 0) or 0, device=device).eval()


def check_fits(model: nn.Module, ds: Any) -> int:
    """Fail with one line when the data does not fit the model's input or label space, or when the model's
    logits on the first batch are NaN or infinite; returns K."""
    from robustest import models as zoo
    from robustest.core.batching import image_shape
    from robustest.core.modelchecks import check_finite_logits, check_model_fits

    spec = getattr(model, "robustest_spec", None)
    if spec:
        zoo.check_spec_input(spec, *image_shape(ds))
    k = check_model_fits(model, ds)
    check_finite_logits(model, ds)
    return k


def load_checked(args: argparse.Namespace, split: str | None = None) -> tuple[nn.Module, Dataset]:
    """(model, data) of the model options and --dataset (``split``: default --split), the data checked to fit the
    model (:func:`check_fits`) before any work: what most verbs load first."""
    model = load_model(args)
    ds = load_data(args, split)
    check_fits(model, ds)
    return model, ds
