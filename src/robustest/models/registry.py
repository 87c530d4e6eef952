"""The model registry: register, create, specs, the Normalize and Logits wrappers, size checks.

Each family module registers its builders with :func:`register` on import; robustest.models imports
them all and presents this module's public API.
"""

from __future__ import annotations

import inspect
import math
import operator
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from robustest.core.errors import ConfigError
from robustest.core.inputs import check_image_size
from robustest.core.modelcall import logits_of
from robustest.core.registry import Registry

#: ImageNet channel statistics (torchvision's pretrained weights expect them): ``create(..., mean=, std=)``.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_SIZE_ARGS = ("num_classes", "in_channels", "input_size")
_RESERVED = {*_SIZE_ARGS, "name", "mean", "std", "options"}


@dataclass(frozen=True)
class ModelEntry:
    """A registered model: its builder ``build(num_classes, in_channels, input_size, **options)`` and what
    :func:`register` records about it (see there)."""

    build: Callable[..., nn.Module]
    description: str
    native: tuple[int, int, int]  # in_channels, input_size, num_classes
    min_size: int
    any_size: bool  # global pooling: takes any size >= min_size, not only the one it was built for
    pattern: re.Pattern[str] | None
    form: str | None
    variants: tuple[str, ...]
    resolve: Callable[[dict[str, Any], int], dict[str, Any]] | None
    options: dict[str, Any] = field(default_factory=dict)


#: every registered model (the one registry shape of :class:`robustest.core.registry.Registry`)
MODELS: Registry[ModelEntry] = Registry("model", canonical=str, entry_type=ModelEntry)


def register(name: str, description: str, *, native: tuple[int, int, int] = (1, 28, 10), min_size: int = 4,
             any_size: bool = False, pattern: str | None = None, form: str | None = None,
             variants: Sequence[str] = (),
             resolve: Callable[[dict[str, Any], int], dict[str, Any]] | None = None,
             ) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator adding a builder ``fn(num_classes, in_channels, input_size, **options) -> nn.Module``.

    ``native``: (in_channels, input_size, num_classes) the model is made for (the defaults of ``create``
    and the size ``profile`` and ``robustest info`` report). ``min_size``: the smallest input side it
    takes. ``any_size``: the network pools globally, so a model built for one size takes any size >=
    ``min_size``. ``pattern``: a regular expression with named integer groups matching names that carry
    options (``r"wrn-(?P<depth>\\d+)-(?P<width>\\d+)"``), shown to users as ``form`` (``"wrn-D-K"``);
    ``variants``: such names listed by ``robustest info``. ``resolve(options, input_size)`` fills options
    whose default depends on the input size (None defaults), so the spec records the value used.
    """

    def deco(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        opts = {}
        for pname, par in inspect.signature(fn).parameters.items():
            if pname in _SIZE_ARGS or par.kind in (par.VAR_POSITIONAL, par.VAR_KEYWORD):
                continue
            if pname in _RESERVED or par.default is inspect.Parameter.empty:
                raise TypeError(f"model option {pname!r} of {name!r} needs a default and another name")
            opts[pname] = par.default
        MODELS.register(name, ModelEntry(fn, description, tuple(native), int(min_size),  # type: ignore[arg-type]
                                         bool(any_size), re.compile(pattern) if pattern else None, form,
                                         tuple(variants), resolve, opts), replace=True)
        return fn

    return deco


def unregister(name: str) -> ModelEntry:
    """Remove model ``name`` from the zoo and return its entry."""
    return MODELS.unregister(resolve_name(name)[0])


def names() -> list[str]:
    """Registered model names (a parameterised family once, e.g. ``wrn``; see :func:`variants`)."""
    return sorted(MODELS.names())


def variants() -> list[str]:
    """Named variants of the parameterised families (``wrn-16-4``, ``wrn-28-10``, ...)."""
    return [v for n in names() for v in MODELS.get(n).variants]


def _choices() -> str:
    return ", ".join(f"{n} ({MODELS.get(n).form})" if MODELS.get(n).form else n for n in names())


def resolve_name(name: str) -> tuple[str, dict[str, Any]]:
    """``name`` -> (registry entry, options carried by the name): ``"wrn-28-10"`` -> ``("wrn", {"depth":
    28, "width": 10})``, ``"resnet20"`` -> ``("resnet20", {})``. Unknown names are a ConfigError listing the
    choices."""
    if not isinstance(name, str):
        raise ConfigError(f"a model name is a string, got {type(name).__name__}")
    if name in MODELS:
        return name, {}
    for key, entry in MODELS.items():
        m = entry.pattern.fullmatch(name) if entry.pattern else None
        if m:
            return key, {k: int(v) for k, v in m.groupdict().items()}
    raise ConfigError(f"unknown model {name!r}: choose one of {_choices()}")


def describe(name: str) -> str:
    """One-line description of a registered model (a parameterised name describes its family)."""
    return MODELS.get(resolve_name(name)[0]).description


def native(name: str) -> tuple[int, int, int]:
    """(in_channels, input_size, num_classes) model ``name`` is made for."""
    return MODELS.get(resolve_name(name)[0]).native


def options(name: str) -> dict[str, Any]:
    """The architecture options of model ``name`` with their defaults (those carried by a parameterised name,
    e.g. ``wrn-40-2``, filled in): the keywords :func:`create` accepts beyond the sizes."""
    key, from_name = resolve_name(name)
    return {**MODELS.get(key).options, **from_name}


def check_options(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` when every key is an architecture option of zoo model ``name`` (:func:`options`); a one-line
    ConfigError naming the first that is not, and the model's options, otherwise."""
    known = options(name)
    for key in given:
        if key not in known:
            raise ConfigError(f"model {name!r} has no option {key!r} (its options: "
                              f"{', '.join(sorted(known)) or 'none'})")
    return given


def check_spec_input(spec: dict[str, Any], channels: int, height: int, width: int) -> None:
    """Refuse, with one line, images of ``channels`` x ``height`` x ``width`` that a zoo model built from ``spec``
    cannot take: another number of channels, or a size it does not accept (:func:`accepts_size`; the message names
    the zoo models made for that size)."""
    if spec.get("in_channels") not in (None, channels):
        raise ConfigError(f"the model takes {spec['in_channels']}-channel images but the data has {channels} channels")
    size = spec.get("input_size")
    if size is not None and not accepts_size(spec, height, width):
        raise ConfigError(f"the model takes {size}x{size} images but the data is {height}x{width}: models for "
                          f"{height}x{width} images: {', '.join(suggest(height)) or 'none in the zoo'}")


def check_input(name: str, in_channels: int, input_size: int, num_classes: int | None = None,
                **options: Any) -> dict[str, Any]:
    """Check, before any work and without allocating weights (the model is built on the meta device), that
    zoo model ``name`` with ``options`` takes ``in_channels`` x ``input_size`` x ``input_size`` images; returns
    its spec. A size it cannot take is the one-line ConfigError of :func:`create`, naming the model, the
    input and the zoo models that fit it; unknown or invalid options are refused the same way."""
    check_image_size((int(in_channels), int(input_size), int(input_size)))  # a size no model is run on: no probe
    with torch.device("meta"):
        model = create(name, num_classes=num_classes, in_channels=in_channels, input_size=input_size, **options)
    return spec_of(model)


# Models worth suggesting for an input side up to the key (ordered; only those that take the size remain).
_SUGGEST = ((16, ("digits_cnn", "resnet20", "preact_resnet18")), (28, ("lenet5", "convnet", "resnet20")),
            (96, ("resnet20", "preact_resnet18", "wrn-28-10")), (math.inf, ("resnet18", "resnet50")))


def suggest(input_size: int) -> list[str]:
    """Zoo models suited to ``input_size`` x ``input_size`` images (for error messages and users)."""
    for limit, cands in _SUGGEST:
        if input_size <= limit:
            out = []
            for c in cands:
                try:
                    key, _ = resolve_name(c)
                except ConfigError:
                    continue
                if MODELS.get(key).min_size <= input_size:
                    out.append(c)
            return out
    return []  # pragma: no cover - the last limit is infinite


def _size_problem(name: str, in_channels: int, input_size: int, reason: str) -> ConfigError:
    sugg = suggest(input_size)
    tip = f": for {input_size}x{input_size} images use {', '.join(sugg)}" if sugg else ""
    return ConfigError(f"model {name!r} cannot take {in_channels}x{input_size}x{input_size} inputs "
                       f"({reason}){tip}")


class Normalize(nn.Module):
    """Per-channel standardisation ``(x - mean) / std`` inside the model. x: N x C x H x W."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        mean_t = torch.as_tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1)
        std_t = torch.as_tensor(list(std), dtype=torch.float32).view(1, -1, 1, 1)
        if bool((std_t <= 0).any()):
            raise ConfigError(f"std must be positive, got {list(std)}")
        self.register_buffer("mean", mean_t)
        self.register_buffer("std", std_t)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def extra_repr(self) -> str:
        return f"mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()}"


class Logits(nn.Module):
    """Wrap a model whose forward returns more than logits, selecting them with ``output``.

    ``output`` is a dict key or attribute name (str), a tuple/list position (int), or a callable mapping the
    raw output to the N x K logits; None uses :func:`robustest.core.modelcall.logits_of`'s rules (a tensor, the
    ``logits`` attribute/key, the first tensor of a tuple or dict). The wrapped model is ``self.model``, so
    its parameters and state_dict keys (prefixed ``model.``) stay reachable.
    """

    def __init__(self, model: nn.Module, output: str | int | Callable[[Any], torch.Tensor] | None = None) -> None:
        super().__init__()
        if output is not None and not isinstance(output, (str, int)) and not callable(output):
            raise ConfigError(f"output must be a key, an index or a callable, got {type(output).__name__}")
        self.model = model
        self.output = output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        sel = self.output
        if sel is None:
            return logits_of(out)
        if callable(sel):
            return sel(out)
        try:
            if isinstance(sel, int):
                return out[sel]
            return out[sel] if isinstance(out, dict) else getattr(out, sel)
        except (KeyError, IndexError, AttributeError, TypeError) as exc:
            raise ConfigError(f"the model's output ({type(out).__name__}) has no part {sel!r}: "
                              "check the output= key or index") from exc


class _WithNormalize(nn.Sequential):
    def __init__(self, norm: Normalize, net: nn.Module) -> None:
        super().__init__(OrderedDict([("normalize", norm), ("net", net)]))


def unwrap(model: nn.Module) -> nn.Module:
    """The network inside a zoo model's :class:`Normalize` wrapper (``model.net``), else ``model`` itself.

    Its state_dict has the architecture's own keys, e.g. torchvision's for ``resnet18``/``resnet50``:
    ``models.unwrap(model).load_state_dict(torchvision_state_dict)``.
    """
    return model.net if isinstance(model, _WithNormalize) else model


def _plain_option(key: str, value: Any) -> Any:
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, (bool, int, float, str)):  # numpy scalars, enums: store the plain value
        for t in (bool, int, float, str):
            if isinstance(value, t):
                return t(value)
    if hasattr(value, "item") and callable(value.item):
        return _plain_option(key, value.item())
    raise ConfigError(f"model option {key}={value!r} must be a number, a string, a bool or None")


def create(name: str, num_classes: int | None = None, in_channels: int | None = None,
           input_size: int | None = None, mean: Sequence[float] | float | None = None,
           std: Sequence[float] | float | None = None, **options: Any) -> nn.Module:
    """Build model ``name`` for ``in_channels`` x ``input_size`` x ``input_size`` inputs in [0, 1].

    Sizes left None take the model's native values (:func:`native`). ``options`` are the architecture's
    options (``dropout=0.3`` for ``wrn``, ``patch=8`` for ``vit_tiny``, ...); a name may carry some
    (``"wrn-40-2"``). Returns an ``nn.Module`` mapping N x C x H x W to logits N x ``num_classes``, with
    its spec in ``model.robustest_spec``.
    """
    key, from_name = resolve_name(name)
    entry = MODELS.get(key)
    c0, s0, k0 = entry.native
    num_classes = k0 if num_classes is None else num_classes
    in_channels = c0 if in_channels is None else in_channels
    input_size = s0 if input_size is None else input_size
    sizes = {"num_classes": num_classes, "in_channels": in_channels, "input_size": input_size}
    for arg, val in sizes.items():
        try:
            sizes[arg] = operator.index(val)  # ints, NumPy and tensor integers
        except TypeError:
            raise ConfigError(f"{arg} must be an integer, got {val!r}") from None
        if isinstance(val, bool):
            raise ConfigError(f"{arg} must be an integer, got {val!r}")
    num_classes, in_channels, input_size = sizes["num_classes"], sizes["in_channels"], sizes["input_size"]
    if num_classes < 2:
        raise ConfigError(f"num_classes must be >= 2, got {num_classes}")
    if in_channels < 1:
        raise ConfigError(f"in_channels must be >= 1, got {in_channels}")
    if input_size < 4:
        raise ConfigError(f"input_size must be >= 4, got {input_size}")
    if (mean is None) != (std is None):
        raise ConfigError("give both mean and std (or neither)")

    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        has = ", ".join(sorted(entry.options)) or "none"
        raise ConfigError(f"model {key!r} has no option {unknown[0]!r} (its options: {has})")
    for k, v in from_name.items():
        if k in options and options[k] != v:
            raise ConfigError(f"model {name!r} has {k}={v} but {k}={options[k]!r} was given: drop one")
    opts = {**entry.options, **from_name, **options}
    if entry.resolve is not None:
        opts = entry.resolve(dict(opts), input_size)
    opts = {k: _plain_option(k, v) for k, v in opts.items()}

    def per_channel(v: Sequence[float] | float) -> list[float]:
        vals = [float(v)] * in_channels if isinstance(v, (int, float)) else [float(t) for t in v]
        if len(vals) != in_channels:
            raise ConfigError(f"mean/std need {in_channels} values (one per channel), got {len(vals)}")
        return vals

    mean_l = per_channel(mean) if mean is not None else None
    std_l = per_channel(std) if std is not None else None
    if input_size < entry.min_size:
        raise _size_problem(name, in_channels, input_size,
                            f"it needs at least {entry.min_size}x{entry.min_size}, native {c0}x{s0}x{s0}")
    try:
        net = entry.build(num_classes=num_classes, in_channels=in_channels, input_size=input_size, **opts)
    except RuntimeError as exc:  # e.g. an input too small for the architecture's pooling
        raise _size_problem(name, in_channels, input_size, str(exc).splitlines()[0] if str(exc) else "") from exc
    model: nn.Module = net
    if mean_l is not None and std_l is not None:
        model = _WithNormalize(Normalize(mean_l, std_l), net)
    model.robustest_spec = {  # type: ignore[assignment]
        "name": name, "num_classes": num_classes, "in_channels": in_channels, "input_size": input_size,
        "mean": mean_l, "std": std_l, "options": opts,
    }
    return model


def spec_of(model: nn.Module) -> dict[str, Any]:
    """The spec (registry name, sizes, mean/std and options) a zoo model was built from (a copy)."""
    spec = getattr(model, "robustest_spec", None)
    if spec is None:
        raise ConfigError("model was not built by robustest.models.create; pass its spec explicitly")
    out = dict(spec)
    if isinstance(out.get("options"), dict):
        out["options"] = dict(out["options"])
    return out


def from_spec(spec: dict[str, Any]) -> nn.Module:
    """Rebuild a zoo model from its spec (``model.robustest_spec``, as stored in checkpoints).

    Specs written before options existed (no ``options`` key) rebuild with the defaults of that time.
    """
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ConfigError("a model spec is a dict with at least a 'name'")
    kwargs = {k: spec[k] for k in (*_SIZE_ARGS, "mean", "std") if k in spec}
    options = spec.get("options") or {}
    if not isinstance(options, dict):
        raise ConfigError(f"the model spec's options must be a dict, got {type(options).__name__}")
    return create(spec["name"], **kwargs, **options)


def accepts_size(spec: dict[str, Any], height: int, width: int) -> bool:
    """Whether a model built from ``spec`` takes ``height`` x ``width`` images: models that pool globally
    (the residual networks) take any size from their minimum; the others only the size they were built for."""
    size = spec.get("input_size")
    try:
        entry = MODELS.get(resolve_name(spec.get("name", ""))[0])
    except ConfigError:
        entry = None
    if entry is not None and entry.any_size:
        return min(height, width) >= entry.min_size
    return size is None or (height, width) == (size, size)
