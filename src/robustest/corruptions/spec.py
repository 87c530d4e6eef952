"""The record of one corruption and the registry that holds them.

Each family module (``noise``, ``blur``, ``weather``, ``digital``, ``jpeg``, ``spatter``) defines the
:class:`CorruptionSpec` records of its corruptions beside their functions, parameter tables included;
:mod:`robustest.corruptions.registry` registers them in the benchmarks' order and runs them. :func:`register`
adds one from outside the package: :func:`robustest.corruptions.corrupt`, the evaluation's corruption accuracy,
the weak-robust validation and the CLI then take it by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from robustest.core.errors import ConfigError
from robustest.core.registry import Registry

__all__ = ["CORRUPTIONS", "FAMILIES", "SMALL_IMAGE_MAX", "TABLES", "CorruptionSpec", "canonical", "group",
           "register", "registered", "unregister"]

TABLES = ("cifar", "imagenet")
"""The parameter tables: CIFAR-10-C's (``make_cifar_c.py``) and ImageNet-C's (``make_imagenet_c.py``)."""
SMALL_IMAGE_MAX = 64
"""Images with ``max(H, W) <=`` this use the CIFAR table by default."""
FAMILIES = ("noise", "blur", "weather", "digital")
"""The families of the 15 common corruptions (the held-out ones belong to none)."""

#: fn(x float N x C x H x W in [0, 1], the severity's parameter, a seeded generator, the table) -> images
CorruptionFn = Callable[[torch.Tensor, Any, torch.Generator, str], torch.Tensor]


def canonical(name: str) -> str:
    """The registry spelling of a corruption's name: stripped, lower case, ``-`` read as ``_``."""
    return str(name).strip().lower().replace("-", "_")


@dataclass(frozen=True)
class CorruptionSpec:
    """One corruption.

    ``fn``: see :data:`CorruptionFn` (values may leave [0, 1]: :func:`robustest.corruptions.corrupt` clamps);
    ``params``: for each table of :data:`TABLES`, the parameter of severities 1-5 (five entries, as published);
    ``family``: one of :data:`FAMILIES` for a common corruption, None otherwise; ``held_out``: one of the four
    held-out corruptions (the validation set of the benchmarks); ``number``: its position in the benchmarks'
    list (imagecorruptions' ``corruption_number``; None for one registered from outside); ``chunked``: on the
    CPU, run through cache-sized chunks of the batch (multi-pass corruptions); ``aliases``: other names.
    """

    name: str
    fn: CorruptionFn
    description: str
    params: Mapping[str, Sequence[Any]]
    family: str | None = None
    held_out: bool = False
    number: int | None = None
    chunked: bool = False
    aliases: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigError(f"corruption {self.name!r}: fn must be callable, got {self.fn!r}")
        for table in TABLES:
            values = self.params.get(table) if isinstance(self.params, Mapping) else None
            if values is None or isinstance(values, (str, bytes)) or len(values) != 5:
                raise ConfigError(f"corruption {self.name!r}: params[{table!r}] must hold the parameters of "
                                  "severities 1-5 (five entries)")
        if self.family is not None and self.family not in FAMILIES:
            raise ConfigError(f"corruption {self.name!r}: family must be one of {', '.join(FAMILIES)} or None, "
                              f"got {self.family!r}")


#: every registered corruption, in the benchmarks' order (then those registered from outside)
CORRUPTIONS: Registry[CorruptionSpec] = Registry("corruption", canonical=canonical, entry_type=CorruptionSpec)


def register(spec: CorruptionSpec, *, replace: bool = False) -> CorruptionSpec:
    """Add ``spec`` under its name and aliases (a taken name needs ``replace=True``); returns it."""
    if not isinstance(spec, CorruptionSpec):
        raise ConfigError(f"register takes a robustest.corruptions.CorruptionSpec, got {type(spec).__name__}")
    return CORRUPTIONS.register(spec.name, spec, aliases=spec.aliases, replace=replace)


def unregister(name: str) -> CorruptionSpec:
    """Remove corruption ``name`` (and its aliases) and return its record."""
    return CORRUPTIONS.unregister(name)


@contextmanager
def registered(spec: CorruptionSpec, *, replace: bool = False) -> Iterator[CorruptionSpec]:
    """``with registered(CorruptionSpec(...)):`` the corruption runs by name inside the block only."""
    with CORRUPTIONS.registered(spec.name, spec, aliases=spec.aliases, replace=replace):
        yield spec


def group(name: str) -> list[str] | None:
    """The corruptions of group ``name`` in registry order: ``common`` (those of a family: the 15 of the
    benchmarks, and any registered with one), ``held-out`` or ``validation`` (the held-out ones), or one family
    of :data:`FAMILIES`; None when ``name`` is no group."""
    key = canonical(name).replace("_", "-")
    specs = [s for _, s in CORRUPTIONS.items()]
    if key == "common":
        return [s.name for s in specs if s.family is not None]
    if key in ("held-out", "validation"):
        return [s.name for s in specs if s.held_out]
    if key in FAMILIES:
        return [s.name for s in specs if s.family == key]
    return None
