"""Argument types and adders of the CLI: the data, model and run options every verb shares, the number, radius
and share types (one check each, from robustest.core.validation), and the one list syntax (``1-5``, ``a,b``)."""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from robustest import data as datasets
from robustest.core.errors import ConfigError
from robustest.core.options import OptionSource
from robustest.core.validation import arg, check_eps, check_float, check_int, check_seed, parse_number

__all__ = ["LIST_SYNTAX", "LOADER_FLAGS", "MAX_RANGE_ITEMS", "add_data_args", "add_model_args",
           "add_option_args", "add_output_flags", "add_run_args", "available_cores", "batch_size_arg", "below_one",
           "finish_verb_parser", "finite_float", "fraction", "int_list", "json_object", "key_value", "learning_rate",
           "linf_eps", "linf_eps_list", "list_arg", "model_options_object", "name_list", "noise_width",
           "non_negative_float", "non_negative_int", "options_from_args", "parse_list", "positive_float",
           "positive_float_list", "positive_int", "radius", "seed_int", "share_arg", "significance", "thread_count",
           "unit_float"]


#: the loader options every verb that reads data offers as flags (robustest.data.LoadOptions' fields)
LOADER_FLAGS = ("limit", "num_classes", "corruption", "severity", "resize", "center_crop", "workers")


def add_data_args(p: argparse.ArgumentParser, split: str | None = "test", required: bool = True) -> None:
    """--dataset, --data-dir, --split, --limit and the loader options (--num-classes, --corruption, --severity,
    --resize, --center-crop, --workers)."""
    p.add_argument("--dataset", required=required, metavar="NAME",
                   help=f"data set name: {', '.join(datasets.names())}")
    p.add_argument("--data-dir", metavar="DIR", default=None,
                   help="folder or file holding the data (default: $ROBUSTEST_DATA); not needed for digits")
    if split is not None:
        p.add_argument("--split", choices=datasets.SPLITS, default=split, help=f"data split (default: {split})")
    add_option_args(p, datasets.LoadOptions, LOADER_FLAGS)


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


def finish_verb_parser(p: argparse.ArgumentParser) -> None:
    """What every verb's parser shares, added once: --quiet, --no-progress and --threads, and help texts in plain
    text (reStructuredText markup stripped)."""
    from robustest.cli.output import plain

    add_output_flags(p)
    if "--threads" not in p._option_string_actions:
        p.add_argument("--threads", type=thread_count, default=None, metavar="N",
                       help="CPU threads for torch in this process (default: torch's choice; under torchrun give "
                            "each rank its share of the cores)")
    p.description = plain(p.description)
    p.epilog = plain(p.epilog)
    for action in p._actions:
        if isinstance(action.help, str):
            action.help = plain(action.help)


def add_output_flags(p: argparse.ArgumentParser) -> None:
    """--no-progress and --quiet (each added once; the command adds them to every verb's parser)."""
    if "--no-progress" not in p._option_string_actions:
        p.add_argument("--no-progress", action="store_true",
                       help="hide progress bars (they are off anyway when stderr is not a terminal)")
    if "--quiet" not in p._option_string_actions:
        p.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")


# every number flag is an argparse type built from the validation layer's checks (robustest.core.validation.arg), so a
# flag accepts what the YAML key and the keyword argument accept; every float flag takes a fraction: --eps 8/255
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


def _option_types() -> dict[str, Callable[[str], Any]]:
    """How a flag reads an option of each kind (robustest.core.options.KINDS, but choice, switch and flag)."""
    return {"number": finite_float, "positive": positive_float, "non-negative": non_negative_float,
            "below-one": below_one, "unit": unit_float, "rate": learning_rate, "radius": radius, "linf-eps": linf_eps,
            "noise-width": noise_width, "significance": significance,
            "count": non_negative_int, "positive-int": positive_int, "seed": seed_int,
            "epochs": positive_float_list("milestone"), "text": str, "json": json_object, "batch-size": batch_size_arg}


def add_option_args(g: argparse._ActionsContainer, source: OptionSource, names: Sequence[str] | None = None,
                    defaults: Mapping[str, Any] | None = None, unset: bool = False,
                    shown: Mapping[str, str] | None = None) -> None:
    """One flag per option of ``source`` (a dataclass of :func:`robustest.core.options.option` fields, or a
    function with its parameters' specs; ``names``: those the verb offers, in that order, default all), read as the
    option's kind says, with its help and the default it states.

    The flag's default is the option's, or the verb's in ``defaults``; with ``unset``, an option not in ``defaults``
    defaults to None, so the verb can tell a flag given from one left out (the help still shows the option's).
    ``shown``: the default a help states for an option, where the verb's differs from the option's and is not a flag
    default (e.g. harden's SGD without Nesterov)."""
    from robustest.core.options import options_of

    types, defaults = _option_types(), defaults or {}
    for o in options_of(source, names):
        flag = ("--" + o.flag_name, *("--" + a for a in o.aliases))
        default = defaults.get(o.name, None if unset else o.default)
        stated = (shown or {}).get(o.name) or o.shown or _shown(o.default if default is None else default, o.kind)
        text = o.help.replace("%", "%%") + ("" if stated is None else f" (default: {stated})")
        if o.kind == "switch":
            g.add_argument(*flag, action=argparse.BooleanOptionalAction, default=default, help=text)
        elif o.kind == "flag":
            g.add_argument(*flag, action="store_true", default=default, help=o.help.replace("%", "%%"))
        elif o.kind == "choice":
            choices = o.choices() if callable(o.choices) else o.choices
            g.add_argument(*flag, choices=choices, default=default, help=text, metavar=o.metavar)
        elif o.kind == "size":
            g.add_argument(*flag, type=positive_int, nargs=2, default=default, help=text, metavar=("H", "W"))
        else:
            g.add_argument(*flag, type=types[o.kind], default=default, help=text, metavar=o.metavar)


def _shown(value: Any, kind: str) -> str | None:
    """A default as a help states it: on/off for a switch, none for an unset choice, a number in %g."""
    if kind == "switch":
        return "on" if value else "off"
    if kind == "choice":
        return value or "none"
    if value is None or isinstance(value, (bool, dict)):
        return None
    return f"{value:g}" if isinstance(value, float) else str(value)


def options_from_args(source: OptionSource, args: argparse.Namespace, names: Sequence[str] | None = None
                      ) -> dict[str, Any]:
    """The values of the options of ``source`` (``names``: only those) the verb's flags parsed into ``args``, by
    option name (a flag named otherwise, such as ``--whitebox-pgd-steps`` for ``pgd_steps``, keeps its own ``args``
    attribute, which the run's recorded settings use: :func:`robustest.cli.settings.option_settings`)."""
    from robustest.core.options import options_of

    return {o.name: getattr(args, o.dest) for o in options_of(source, names)}
