"""Arguments and helpers shared by the CLI verbs."""

from __future__ import annotations

import argparse
import math
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from robustest import data as datasets
from robustest.errors import ConfigError
from robustest.runtime import resolve_device


def add_data_args(p: argparse.ArgumentParser, split: str | None = "test", required: bool = True) -> None:
    """--dataset, --data-dir, --split, --limit and the loader options (--num-classes, --corruption, --severity,
    --resize, --center-crop, --workers)."""
    p.add_argument("--dataset", required=required, metavar="NAME",
                   help=f"data set name: {', '.join(datasets.names())}")
    p.add_argument("--data-dir", metavar="DIR", default=None,
                   help="folder or file holding the data (default: $ROBUSTEST_DATA); not needed for digits")
    if split is not None:
        p.add_argument("--split", choices=datasets.SPLITS, default=split, help=f"data split (default: {split})")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N",
                   help="use only the first N samples (read before decoding)")
    p.add_argument("--num-classes", type=positive_int, default=None, metavar="K",
                   help="labels must lie below K (default: the data set's own, else below 100,000)")
    p.add_argument("--corruption", metavar="NAME", default=None,
                   help="corruption of a published -C set (cifar10-c, cifar100-c, mnist-c, imagenet-c, ...)")
    p.add_argument("--severity", type=positive_int, default=None, metavar="S", help="severity 1-5 of a -C set")
    p.add_argument("--resize", type=positive_int, nargs=2, default=None, metavar=("H", "W"),
                   help="resize image-folder images to H x W (for folders of mixed sizes)")
    p.add_argument("--center-crop", type=positive_int, nargs=2, default=None, metavar=("H", "W"),
                   help="then crop the centre H x W of each image")
    p.add_argument("--workers", type=non_negative_int, default=0, metavar="N",
                   help="DataLoader worker processes decoding images (default: 0, in the main process)")


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The model options every verb that takes a model shares: --checkpoint (robustest checkpoint, TorchScript
    with --torchscript, torch.export .pt2) or --model pkg.module:factory [--model-args JSON] [--weights FILE]."""
    g = p.add_argument_group("model (give --checkpoint, or --model for your own code)")
    g.add_argument("--checkpoint", metavar="FILE", default=None,
                   help="model.pt from 'robustest train' (safe: weights only), a torch.export program (.pt2), or "
                        "a TorchScript archive with --torchscript; with --model: that model's weights")
    g.add_argument("--torchscript", action="store_true",
                   help="accept a TorchScript archive as --checkpoint: it RUNS CODE from the file, so only from a "
                        "source you trust")
    g.add_argument("--model", dest="model_factory", metavar="PKG.MODULE:FACTORY", default=None,
                   help="build the model by calling your function or class (imported from PYTHONPATH or the "
                        "current folder): this RUNS YOUR CODE")
    g.add_argument("--model-args", type=json_object, default=None, metavar="JSON",
                   help="keyword arguments for --model as a JSON object, e.g. '{\"num_classes\": 10}'")
    g.add_argument("--weights", metavar="FILE", default=None,
                   help="state_dict for --model (read with torch.load(weights_only=True))")


def add_checkpoint_arg(p: argparse.ArgumentParser) -> None:
    """The model options (:func:`add_model_args`)."""
    add_model_args(p)


def json_object(text: str) -> dict[str, Any]:
    """An argparse ``type=``: a JSON object (keyword arguments)."""
    import json

    try:
        v = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({exc})") from None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"width\": 2}}', got {text!r}")
    return v


def add_run_args(p: argparse.ArgumentParser, out_required: bool = True) -> None:
    """--out, --seed, --device, --batch-size-eval, --no-progress."""
    p.add_argument("--out", required=out_required, metavar="DIR", help="output folder (created if missing)")
    p.add_argument("--seed", type=seed_int, default=0, help="random seed (default: 0)")
    p.add_argument("--device", default=None, metavar="D",
                   help="cpu, cuda, cuda:N or auto (default: the model's device, i.e. cpu)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _number_type(convert: Callable[[str], Any], ok: Callable[[Any], bool], what: str, name: str
                 ) -> Callable[[str], Any]:
    """An argparse ``type=``: ``convert`` the text, then require a finite value and ``ok``; otherwise one line
    "expected <what>". NaN and infinities are refused by every number type."""

    def parse(text: str) -> Any:
        try:
            v = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"expected {what} (finite), got {text!r}")
        if not ok(v):
            raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
        return v

    parse.__name__ = name
    return parse


positive_int = _number_type(int, lambda v: v >= 1, "a positive integer", "positive_int")
positive_float = _number_type(float, lambda v: v > 0, "a positive number", "positive_float")
non_negative_int = _number_type(int, lambda v: v >= 0, "a non-negative integer", "non_negative_int")
non_negative_float = _number_type(float, lambda v: v >= 0, "a non-negative number", "non_negative_float")
finite_float = _number_type(float, lambda v: True, "a number", "finite_float")
fraction = _number_type(float, lambda v: 0 < v <= 1, "a fraction in (0, 1]", "fraction")  # a number in (0, 1]
unit_float = _number_type(float, lambda v: 0 <= v <= 1, "a number in [0, 1]", "unit_float")
linf_eps = _number_type(float, lambda v: 0 < v <= 1, "an L-inf radius in (0, 1] (pixel scale, e.g. 8/255 = 0.031)",
                        "linf_eps")
noise_width = _number_type(float, lambda v: 0 < v <= 2, "a noise width in (0, 2] (pixel scale)", "noise_width")
seed_int = _number_type(int, lambda v: 0 <= v < 2**63, "a seed: an integer in [0, 2^63)", "seed_int")
below_one = _number_type(float, lambda v: 0 <= v < 1, "a number in [0, 1)", "below_one")  # momentum, smoothing


def key_value(text: str) -> tuple[str, Any]:
    """An argparse ``type=``: ``KEY=VALUE`` with VALUE read as JSON when it parses (numbers, true/false, null)
    and as a string otherwise; non-finite numbers are refused."""
    import json

    key, sep, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE such as dropout=0.3, got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite value for {key}, got {raw!r}")
    if not (value is None or isinstance(value, (bool, int, float, str))):
        raise argparse.ArgumentTypeError(f"expected a number, a string, true/false or null for {key}, got {raw!r}")
    return key, value


def model_options_object(text: str) -> dict[str, Any]:
    """An argparse ``type=``: a JSON object of zoo model options with plain, finite values."""
    d = json_object(text)
    for k, v in d.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"expected finite model options, got {k}={v}")
        if not (v is None or isinstance(v, (bool, int, float, str))):
            raise argparse.ArgumentTypeError(f"model option {k} must be a number, a string, true/false or null, "
                                             f"got {v!r}")
    return d


def load_data(args: argparse.Namespace, split: str | None = None) -> Dataset:
    """Load the data set named by --dataset/--data-dir for ``split`` (default --split) with the loader options
    (--limit applied before decoding); images stay compact and are streamed per batch."""
    return datasets.load(args.dataset, root=args.data_dir, split=split or args.split,
                         limit=getattr(args, "limit", None), num_classes=getattr(args, "num_classes", None),
                         corruption=getattr(args, "corruption", None), severity=getattr(args, "severity", None),
                         resize=getattr(args, "resize", None), center_crop=getattr(args, "center_crop", None),
                         workers=getattr(args, "workers", 0) or 0)


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The model options as keyword arguments of :func:`robustest.checkpoints.load_model`."""
    return {"source": getattr(args, "checkpoint", None), "factory": getattr(args, "model_factory", None),
            "factory_args": getattr(args, "model_args", None), "weights": getattr(args, "weights", None),
            "torchscript": bool(getattr(args, "torchscript", False))}


def load_model(args: argparse.Namespace) -> nn.Module:
    """The model named by the model options (refusing unsafe files), on --device."""
    from robustest.checkpoints import load_model as load

    opts = model_options(args)
    if opts["factory_args"] is not None and opts["factory"] is None:
        raise ConfigError("--model-args applies to --model pkg.module:factory")
    if opts["source"] is None and opts["factory"] is None:
        raise ConfigError("no model given: pass --checkpoint FILE (or --model pkg.module:factory [--weights FILE])")
    device = resolve_device(None, args.device) if getattr(args, "device", None) else torch.device("cpu")
    return load(**opts, map_location=device)


def check_fits(model: nn.Module, ds: Any) -> int:
    """Fail with one line when the data does not fit the model's input or label space; returns K."""
    from robustest import models as zoo
    from robustest.runtime import check_model_fits, image_shape

    spec = getattr(model, "robustest_spec", None)
    if spec:
        c, h, w = image_shape(ds)
        if spec.get("in_channels") not in (None, c):
            raise ConfigError(f"the model takes {spec['in_channels']}-channel images but the data has {c} channels")
        size = spec.get("input_size")
        if size is not None and not zoo.accepts_size(spec, h, w):
            raise ConfigError(f"the model takes {size}x{size} images but the data is {h}x{w}: models for "
                              f"{h}x{w} images: {', '.join(zoo.suggest(h)) or 'none in the zoo'}")
    return check_model_fits(model, ds)


def out_dir(args: argparse.Namespace) -> Path:
    path = Path(args.out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {str(path)!r} exists and is not a folder: choose another path")
    path.mkdir(parents=True, exist_ok=True)
    return path


def peak_rss_mib() -> float:
    """Peak resident memory of this process in MiB."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024.0 if sys.platform != "darwin" else kb / 2**20


def print_table(rows: list[dict], columns: list[str], file=None) -> None:
    """Print rows as a plain aligned table."""
    file = file or sys.stdout
    cells = [[str(c) for c in columns]] + [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for j, row in enumerate(cells):
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)), file=file)
        if j == 0:
            print("  ".join("-" * w for w in widths), file=file)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)
