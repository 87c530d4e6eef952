"""Arguments and helpers shared by the CLI verbs: data and model options, number and list types, logging and
progress switches, printed tables, and the settings a verb records in its results.json."""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import resource
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from robustest import data as datasets
from robustest.core.devices import resolve_device
from robustest.core.errors import ConfigError
from robustest.core.validation import arg, check_eps, check_float, check_int, check_seed, parse_number


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
                   help="use only N samples, chosen before decoding: the first N of the array formats (MNIST, "
                        "CIFAR, npz, npy), a seeded class-stratified subset of N images of a class-per-folder set")
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


def add_model_args(p: argparse.ArgumentParser, zoo: bool = False) -> None:
    """The model options every verb that takes a model shares: --checkpoint (robustest checkpoint, TorchScript
    with --torchscript, torch.export .pt2) or --model pkg.module:factory [--model-args JSON] [--weights FILE]
    (--random-init to run it with its random weights on purpose). ``zoo``: --model also takes a zoo name (a verb
    that trains: with --from-scratch, the same flag as --random-init)."""
    g = p.add_argument_group("model (give --checkpoint, or --model for your own code)")
    g.add_argument("--checkpoint", metavar="FILE", default=None,
                   help="model.pt of a zoo model from 'robustest train' or 'harden' (safe: weights only), a "
                        "torch.export program (.pt2), or a TorchScript archive with --torchscript; the weights of "
                        "your own model go in --weights")
    g.add_argument("--torchscript", action="store_true",
                   help="accept a TorchScript archive as --checkpoint: it RUNS CODE from the file, so only from a "
                        "source you trust")
    g.add_argument("--model", dest="model_factory", metavar="NAME|PKG.MODULE:FACTORY" if zoo else "PKG.MODULE:FACTORY",
                   default=None, help=("a zoo architecture (robustest info --models) with --from-scratch, or " if zoo
                                       else "") + "build the model by calling your function or class (imported from "
                   "PYTHONPATH or the current folder): this RUNS YOUR CODE")
    g.add_argument("--model-args", type=json_object, default=None, metavar="JSON",
                   help="keyword arguments for --model as a JSON object, e.g. '{\"num_classes\": 10}'")
    g.add_argument("--weights", metavar="FILE", default=None,
                   help="the weights of your --model (read with torch.load(weights_only=True)): a state_dict, or a "
                        "checkpoint robustest saved from that factory (harden, enhance, run), whose factory arguments "
                        "it supplies; code runs only when you name it with --model, never because a file names it")
    if zoo:
        g.add_argument("--from-scratch", "--random-init", dest="random_init", action="store_true",
                       help="train --model (a zoo name such as mnist_small, sized from the data, or "
                            "pkg.module:factory) from its random initialisation, seeded by --seed")
    else:
        g.add_argument("--random-init", dest="random_init", action="store_true",
                       help="run --model pkg.module:factory with its random initial weights (no --weights): only "
                            "useful to test the pipeline, accuracies will be at chance")


def add_checkpoint_arg(p: argparse.ArgumentParser, zoo: bool = False) -> None:
    """The model options (:func:`add_model_args`)."""
    add_model_args(p, zoo)


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
    """--out, --seed, --device, --no-progress, --quiet."""
    p.add_argument("--out", required=out_required, metavar="DIR", help="output folder (created if missing)")
    p.add_argument("--seed", type=seed_int, default=0, help="random seed (default: 0)")
    p.add_argument("--device", default=None, metavar="D",
                   help="cpu, cuda, cuda:N or auto (default: the model's device, i.e. cpu)")
    add_output_flags(p)


def add_output_flags(p: argparse.ArgumentParser) -> None:
    """--no-progress and --quiet (each added once; the command adds them to every verb's parser)."""
    if "--no-progress" not in p._option_string_actions:
        p.add_argument("--no-progress", action="store_true",
                       help="hide progress bars (they are off anyway when stderr is not a terminal)")
    if "--quiet" not in p._option_string_actions:
        p.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")


# every number flag is an argparse type built from the validation layer's checks (robustest.core.validation.arg),
# so a flag accepts what the YAML key and the keyword argument accept; every float flag takes a fraction as
# well: --eps 8/255, --alpha 2/255
positive_int = arg(check_int, "a positive integer", lo=1)
positive_float = arg(check_float, "a positive number", lo=0, lo_open=True)
non_negative_int = arg(check_int, "a non-negative integer", lo=0)
non_negative_float = arg(check_float, "a non-negative number", lo=0)
finite_float = arg(check_float, "a number")
fraction = arg(check_float, "a fraction in (0, 1]", lo=0, hi=1, lo_open=True)
unit_float = arg(check_float, "a number in [0, 1]", lo=0, hi=1)
noise_width = arg(check_float, "a noise width in (0, 2] (pixel scale)", lo=0, hi=2, lo_open=True)
seed_int = arg(check_seed, "a seed: an integer in [0, 2^63)")
learning_rate = arg(check_float, "a learning rate in (0, 10]", lo=0, hi=10, lo_open=True)
below_one = arg(check_float, "a number in [0, 1)", lo=0, hi=1, hi_open=True)  # momentum, smoothing
significance = arg(check_float, "a significance level in (0, 1), e.g. 0.05", lo=0, hi=1, lo_open=True,
                   hi_open=True)


def share_arg(what: str, example: str) -> Callable[[str], float]:
    """An argparse ``type=`` for a share in [0, 1] written as a fraction or a percentage: ``"0.85"`` or ``"85%"``
    -> 0.85; ``what`` ("an accuracy") and ``example`` ("0.85 or 85%") word its errors."""

    def parse(text: str) -> float:
        t = str(text).strip()
        try:
            v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} like {example}, got {text!r}") from None
        if not 0 <= v <= 1:
            raise argparse.ArgumentTypeError(f"expected {what} in [0, 1] (or 0-100%), got {text!r}")
        return v

    parse.__name__ = "share"
    return parse


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def thread_count(text: str) -> int:
    """An argparse ``type=`` for --threads: a positive integer no larger than :func:`available_cores` (more
    threads than cores only slow torch down, and tens of thousands exhaust the machine's processes)."""
    n = positive_int(text)
    cores = available_cores()
    if n > cores:
        raise argparse.ArgumentTypeError(f"expected at most {cores} threads (the cores available to this process), "
                                         f"got {n}")
    return n


def _radius_type(norm: str | None) -> Callable[[str], float]:
    """An argparse ``type=`` for a radius: a number or a fraction (``8/255``) checked by
    :func:`robustest.core.validation.check_eps` for ``norm``; with ``norm`` None (a verb whose ``--norm`` flag decides)
    only read here: the verb applies ``check_eps`` with its norm before any work."""

    def parse(text: str) -> float:
        try:
            v = parse_number(text)
        except ValueError:
            what = "an L-inf radius in (0, 1]" if norm == "linf" else "a radius"
            raise argparse.ArgumentTypeError(f"expected {what} (a number or a fraction like 8/255), got {text!r}"
                                             ) from None
        if norm is None:
            if not math.isfinite(v):
                raise argparse.ArgumentTypeError(f"expected a finite radius, got {text!r}")
            return v
        try:
            return float(check_eps("eps", v, norm))
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "linf_eps" if norm == "linf" else "radius"
    return parse


linf_eps = _radius_type("linf")  # an L-inf radius in (0, 1]
radius = _radius_type(None)  # a radius whose norm another flag gives


def batch_size_arg(text: str) -> int | str:
    """An argparse ``type=``: a positive integer, or ``auto`` (a probe fills the device's memory on CUDA; the
    verb's default elsewhere: see robustest.core.batchsize)."""
    return "auto" if str(text).strip().lower() == "auto" else positive_int(text)


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
    from robustest import models as zoo
    from robustest.core.batching import image_shape, labels_of, num_samples, take

    name = args.model_factory
    if not getattr(args, "random_init", False):
        raise ConfigError(f"--model {name} is a zoo architecture with random weights: add --from-scratch to train "
                          "it from scratch, or fine-tune a trained model with --checkpoint FILE")
    if args.checkpoint is not None or args.weights is not None:
        raise ConfigError("--from-scratch starts from random weights: drop --checkpoint/--weights")
    if args.model_args is not None:
        raise ConfigError("--model-args applies to --model pkg.module:factory, not to zoo models")
    c, h, w = image_shape(data)
    if h != w:
        raise ConfigError(f"images must be square for the zoo models, got {h}x{w}: pass --resize H W")
    y = labels_of(data)
    if y is None:
        y = take(data, torch.arange(num_samples(data)))[1]
    k = max(getattr(args, "num_classes", None) or int(y.max()) + 1, 2)
    zoo.check_input(name, c, h, k)
    device = resolve_device(None, args.device) if getattr(args, "device", None) else torch.device("cpu")
    torch.manual_seed(getattr(args, "seed", 0) or 0)
    return zoo.create(name, num_classes=k, in_channels=c, input_size=h).to(device).eval()


def check_fits(model: nn.Module, ds: Any) -> int:
    """Fail with one line when the data does not fit the model's input or label space, or when the model's
    logits on the first batch are NaN or infinite; returns K."""
    from robustest import models as zoo
    from robustest.core.batching import image_shape
    from robustest.core.modelchecks import check_finite_logits, check_model_fits

    spec = getattr(model, "robustest_spec", None)
    if spec:
        c, h, w = image_shape(ds)
        if spec.get("in_channels") not in (None, c):
            raise ConfigError(f"the model takes {spec['in_channels']}-channel images but the data has {c} channels")
        size = spec.get("input_size")
        if size is not None and not zoo.accepts_size(spec, h, w):
            raise ConfigError(f"the model takes {size}x{size} images but the data is {h}x{w}: models for "
                              f"{h}x{w} images: {', '.join(zoo.suggest(h)) or 'none in the zoo'}")
    k = check_model_fits(model, ds)
    check_finite_logits(model, ds)
    return k


def out_dir(args: argparse.Namespace) -> Path:
    """The --out folder, created and proved writable (stale temporary files of a killed run removed)."""
    from robustest.core.atomic import check_writable

    return check_writable(args.out)


def peak_rss_mib() -> float:
    """Peak resident memory of this process in MiB."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024.0 if sys.platform != "darwin" else kb / 2**20


# ------------------------------------------------------------------------------------------------ lists
_RANGE = re.compile(r"^(\d+)\s*-\s*(\d+)$")
MAX_RANGE_ITEMS = 100_000  # a range a-b expands to a list: bounded before it is built
LIST_SYNTAX = "a comma-separated list; integers also as ranges: 1-5, 1,3,5 or 1-3,5"


def parse_list(text: str, item: Callable[[str], Any] = str, *, ranges: bool = False, what: str = "item",
               lo: int | None = None, hi: int | None = None, sort: bool = False) -> list[Any]:
    """One list syntax for every list option: comma-separated items, and with ``ranges`` integer ranges
    ``a-b`` (inclusive): ``"1-5"`` -> [1..5], ``"1,3,5"``, ``"1-3,5"`` -> [1, 2, 3, 5].

    Each item goes through ``item`` (a conversion raising ValueError or ArgumentTypeError); integers must lie
    in [lo, hi] when given. Duplicates are dropped (first kept); ``sort`` sorts the result. Raises
    :class:`ConfigError` with a one-line message on an empty list, an empty item, a reversed range or a bad item.
    """
    raw = str(text).strip()
    if not raw:
        raise ConfigError(f"empty list: give {LIST_SYNTAX}")
    values: list[Any] = []
    for part in raw.split(","):
        part = part.strip()
        if not part:
            raise ConfigError(f"empty item in {raw!r}: write {LIST_SYNTAX}")
        m = _RANGE.match(part) if ranges else None
        if m:
            a, b = int(m.group(1)), int(m.group(2))
            if a > b:
                raise ConfigError(f"range {part!r} is empty: write it low-high, e.g. {b}-{a}")
            if b - a >= MAX_RANGE_ITEMS:
                raise ConfigError(f"range {part!r} is too large: a range holds at most {MAX_RANGE_ITEMS} values")
            items: list[Any] = list(range(a, b + 1))
        else:
            try:
                items = [item(part)]
            except (ValueError, argparse.ArgumentTypeError) as exc:
                detail = str(exc) if isinstance(exc, argparse.ArgumentTypeError) else ""
                kind = "number or a range (1-5)" if ranges else "valid value"
                raise ConfigError(detail or f"{what} {part!r} is not a {kind}: write {LIST_SYNTAX}") from None
        for v in items:
            if isinstance(v, int) and ((lo is not None and v < lo) or (hi is not None and v > hi)):
                bounds = f"{lo}-{hi}" if lo is not None and hi is not None else (f">= {lo}" if lo is not None
                                                                                  else f"<= {hi}")
                raise ConfigError(f"{what} {v} is outside {bounds}")
            values.append(v)
    values = list(dict.fromkeys(values))
    return sorted(values) if sort else values


def list_arg(item: Callable[[str], Any] = str, *, ranges: bool = False, what: str = "item", lo: int | None = None,
             hi: int | None = None, sort: bool = False) -> Callable[[str], list[Any]]:
    """An argparse ``type=`` parsing one list with :func:`parse_list` (errors become argparse's one-line error)."""

    def parse(text: str) -> list[Any]:
        try:
            return parse_list(text, item, ranges=ranges, what=what, lo=lo, hi=hi, sort=sort)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = f"{what}_list"
    return parse


def int_list(*, what: str = "value", lo: int | None = None, hi: int | None = None, sort: bool = False
             ) -> Callable[[str], list[int]]:
    """Integers with ranges: ``1-5``, ``1,3,5``, ``1-3,5``."""
    return list_arg(int, ranges=True, what=what, lo=lo, hi=hi, sort=sort)


def name_list(what: str = "name") -> Callable[[str], list[str]]:
    """Names: ``fgsm,pgd,fog``."""
    return list_arg(str, what=what)


def positive_float_list(what: str = "value") -> Callable[[str], list[float]]:
    """Positive numbers: ``0.05,0.1,0.2``."""
    return list_arg(positive_float, what=what)


def linf_eps_list(what: str = "eps") -> Callable[[str], list[float]]:
    """L-inf radii in (0, 1]: ``0.05,0.1,0.2``."""
    return list_arg(linf_eps, what=what)


# ---------------------------------------------------------------------------- messages and progress bars
LOGGER = "robustest"
log = logging.getLogger("robustest.cli")  # what a verb reports: stdout; other robustest loggers: stderr


class _LiveStream(logging.StreamHandler):
    """A handler writing to sys.stdout or sys.stderr as they are when a record is emitted (so redirections made
    after the command started, such as pytest's capture, are honoured)."""

    def __init__(self, name: str) -> None:
        super().__init__(getattr(sys, name))
        self._name = name

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = getattr(sys, self._name)
        super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """A reader that went away (``robustest info | head``): the rest of the output goes to /dev/null,
        quietly, instead of one traceback per message."""
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            import os

            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
            except (OSError, ValueError, AttributeError):
                setattr(sys, self._name, open(os.devnull, "w"))  # noqa: SIM115 - for the rest of the process
            return
        super().handleError(record)


class _Formatter(logging.Formatter):
    def __init__(self, verb: str) -> None:
        super().__init__("%(message)s")
        self.prefix = f"robustest {verb}" if verb else "robustest"

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.WARNING:
            return f"{self.prefix}: {record.levelname.lower()}: {text}"
        return text


def _to_stdout(record: logging.LogRecord) -> bool:
    return record.name.startswith("robustest.cli") and record.levelno < logging.WARNING


def configure_logging(verb: str = "", quiet: bool = False) -> Callable[[], None]:
    """Route the ``robustest`` loggers for one command: the verb's report lines (logger ``robustest.cli``, INFO)
    to stdout; library messages, warnings and errors to stderr, warnings and errors prefixed with
    ``robustest VERB:``. Python warnings become one-line warnings of the ``robustest.warnings`` logger
    (deprecation warnings of libraries stay hidden, as Python hides them by default). ``quiet`` raises the
    level to ERROR. Returns a function that undoes all of it."""
    import warnings

    level = logging.ERROR if quiet else logging.INFO
    root = logging.getLogger(LOGGER)
    out, err = _LiveStream("stdout"), _LiveStream("stderr")
    out.addFilter(_to_stdout)
    err.addFilter(lambda r: not _to_stdout(r))
    for h in (out, err):
        h.setFormatter(_Formatter(verb))
    saved = (root.level, root.propagate)
    root.setLevel(level)
    root.propagate = False
    root.addHandler(out)
    root.addHandler(err)
    caught = warnings.catch_warnings()
    caught.__enter__()
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.simplefilter("ignore", PendingDeprecationWarning)
    show_default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 - warnings' signature
        if file is not None:
            return show_default(message, category, filename, lineno, file, line)
        logging.getLogger("robustest.warnings").warning(" ".join(f"{message} ({category.__name__})".split()))
        return None

    warnings.showwarning = show

    def restore() -> None:
        caught.__exit__(None, None, None)
        root.removeHandler(out)
        root.removeHandler(err)
        root.setLevel(saved[0])
        root.propagate = saved[1]

    return restore


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def progress_enabled(args: argparse.Namespace) -> bool:
    """Progress bars are drawn only when asked for (no --no-progress, no --quiet) AND stderr is a terminal: a
    captured log never fills with carriage-return frames."""
    return not getattr(args, "no_progress", False) and not getattr(args, "quiet", False) and _isatty(sys.stderr)


# -------------------------------------------------------------------------------------------- help texts
_RST = [(re.compile(r"``([^`]+)``"), r"\1"), (re.compile(r":(?:func|class|meth|mod|data|attr):`~?([^`]+)`"), r"\1"),
        (re.compile(r"`([^`]+)`"), r"\1")]


def plain(text: str | None) -> str | None:
    """Help text without reStructuredText markup (````code````, ``:func:`x```): plain text for --help."""
    if text is None:
        return None
    for pattern, repl in _RST:
        text = pattern.sub(repl, text)
    return text


# ------------------------------------------------------------------------------------------------- settings
DATA_KEYS = ("dataset", "data_dir", "split", "limit", "num_classes", "corruption", "severity", "resize",
             "center_crop", "workers")


def pick(args: argparse.Namespace, keys: Iterable[str]) -> dict[str, Any]:
    """The options ``keys`` of ``args`` that hold a value (None = not given and no default: not in effect)."""
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def data_settings(args: argparse.Namespace, split: str | None = None) -> dict[str, Any]:
    """The data options in effect (``split`` overrides --split for verbs that read a fixed split)."""
    d = pick(args, DATA_KEYS)
    if split is not None:
        d["split"] = split
    if not d.get("workers"):
        d.pop("workers", None)  # 0: decoded in the main process, nothing to record
    return d


def model_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The model options in effect: checkpoint, model (pkg.module:factory), model_args, weights, torchscript."""
    d: dict[str, Any] = {}
    for key, name in (("checkpoint", "checkpoint"), ("model_factory", "model"), ("model_args", "model_args"),
                      ("weights", "weights")):
        if getattr(args, key, None) is not None:
            d[name] = getattr(args, key)
    if getattr(args, "torchscript", False):
        d["torchscript"] = True
    return d


# ---------------------------------------------------------------------------------------------- printing
def print_table(rows: list[dict], columns: list[str], file=None) -> None:
    """Print rows as a plain aligned table: headers as words, figures rounded by column (as in report.html).
    Goes to ``file`` when given, else through the ``robustest.cli`` logger (stdout; silent with --quiet)."""
    from robustest.report import format_value, header_label

    cells = [[header_label(c) for c in columns]] + [[format_value(r.get(c), c) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for j, row in enumerate(cells):
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    for line in lines:
        if file is not None:
            print(line, file=file)
        else:
            log.info(line)


def fmt(value: Any, key: str = "") -> str:
    """A figure for a printed line, rounded like the report (:func:`robustest.report.format_value`)."""
    from robustest.report import format_value

    return format_value(value, key)
