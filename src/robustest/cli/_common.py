"""Arguments and helpers shared by the CLI verbs."""

from __future__ import annotations

import argparse
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from robustest import data as datasets
from robustest import models as zoo
from robustest.errors import ConfigError
from robustest.runtime import resolve_device


def add_data_args(p: argparse.ArgumentParser, split: str | None = "test", required: bool = True) -> None:
    """--dataset, --data-dir, --split, --limit."""
    p.add_argument("--dataset", required=required, metavar="NAME",
                   help=f"data set name: {', '.join(datasets.names())}")
    p.add_argument("--data-dir", metavar="DIR", default=None,
                   help="folder or file holding the data (default: $ROBUSTEST_DATA); not needed for digits")
    if split is not None:
        p.add_argument("--split", choices=datasets.SPLITS, default=split, help=f"data split (default: {split})")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N", help="use only the first N samples")


def add_run_args(p: argparse.ArgumentParser, out_required: bool = True) -> None:
    """--out, --seed, --device, --batch-size-eval, --no-progress."""
    p.add_argument("--out", required=out_required, metavar="DIR", help="output folder (created if missing)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--device", default=None, metavar="D",
                   help="cpu, cuda, cuda:N or auto (default: the model's device, i.e. cpu)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def add_checkpoint_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, metavar="FILE", help="model.pt written by 'robustest train'")
    p.add_argument("--torchscript", action="store_true",
                   help="accept a TorchScript archive as checkpoint (only from a source you trust)")


def _number_type(convert: Callable[[str], Any], ok: Callable[[Any], bool], what: str, name: str
                 ) -> Callable[[str], Any]:
    """An argparse ``type=``: ``convert`` the text, then require ``ok``; otherwise "expected <what>"."""

    def parse(text: str) -> Any:
        try:
            v = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
        return v

    parse.__name__ = name
    return parse


positive_int = _number_type(int, lambda v: v >= 1, "a positive integer", "positive_int")
positive_float = _number_type(float, lambda v: v > 0, "a positive number", "positive_float")
non_negative_int = _number_type(int, lambda v: v >= 0, "a non-negative integer", "non_negative_int")
fraction = _number_type(float, lambda v: 0 < v <= 1, "a fraction in (0, 1]", "fraction")  # a number in (0, 1]


def model_name(text: str) -> str:
    """An argparse ``type=`` for a zoo model name, parameterised ones included (``wrn-28-10``)."""
    try:
        zoo.resolve_name(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def load_data(args: argparse.Namespace, split: str | None = None) -> TensorDataset:
    """Load the data set named by --dataset/--data-dir for ``split`` (default --split), honouring --limit."""
    ds = datasets.load(args.dataset, root=args.data_dir, split=split or args.split)
    limit = getattr(args, "limit", None)
    if limit is not None and limit < len(ds):
        ds = TensorDataset(*(t[:limit] for t in ds.tensors))
    return ds


def load_model(args: argparse.Namespace) -> nn.Module:
    """Load --checkpoint (refusing unsafe files) and move it to --device."""
    from robustest.training import load_checkpoint

    device = resolve_device(None, args.device) if args.device else torch.device("cpu")
    return load_checkpoint(args.checkpoint, map_location=device, torchscript=args.torchscript)


def check_fits(model: nn.Module, ds: TensorDataset) -> None:
    """Fail with one line when the data does not fit the model's input or label space."""
    spec = getattr(model, "robustest_spec", None)
    if not spec:
        return
    x, y = ds.tensors[0], ds.tensors[1]
    c, h = spec.get("in_channels"), spec.get("input_size")
    if c is not None and x.shape[1] != c:
        raise ConfigError(f"the model takes {c}-channel images but the data has {x.shape[1]} channels")
    if h is not None and not zoo.accepts_size(spec, x.shape[2], x.shape[3]):
        raise ConfigError(f"the model takes {h}x{h} images but the data is {x.shape[2]}x{x.shape[3]}")
    k = spec.get("num_classes")
    if k is not None and int(y.max()) >= k:
        raise ConfigError(f"the data has label {int(y.max())} but the model has {k} classes")


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
