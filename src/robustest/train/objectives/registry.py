"""The registry of training objectives: :func:`register` / :func:`unregister` / :func:`registered` add and remove
one, :func:`get` and :func:`names` are what the loops (harden, fit, enhance), harden's settings, the CLI and RobOT's
hardening strategies read. :func:`names` and :func:`option_owners` see the harden methods only (objectives with
``harden_method``) unless asked for every objective."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from robustest.core.errors import ConfigError
from robustest.core.options import Option
from robustest.core.registry import Registry
from robustest.train.objectives.base import Objective

__all__ = ["OBJECTIVES", "canonical", "get", "names", "option_owners", "register", "registered", "unregister"]


def canonical(name: str) -> str:
    """The registry spelling of ``name``: lower case, ``_`` read as ``-``."""
    return str(name).lower().replace("_", "-")


#: the registered objectives (the one registry shape of :class:`robustest.core.registry.Registry`)
OBJECTIVES: Registry[Objective] = Registry("training objective", canonical=canonical, entry_type=Objective)


def register(objective: Objective, *, replace: bool = False) -> Objective:
    """Add ``objective`` under ``objective.name`` (after the objectives already registered); a second one of the
    same name needs ``replace=True``. Returns ``objective``."""
    if not isinstance(objective, Objective):
        raise ConfigError(f"register takes an Objective, got {type(objective).__name__}")
    return OBJECTIVES.register(objective.name, objective, replace=replace)


def unregister(name: str) -> Objective:
    """Remove and return the objective ``name`` (ConfigError when there is none)."""
    get(name)
    return OBJECTIVES.unregister(name)


@contextmanager
def registered(objective: Objective, *, replace: bool = False) -> Iterator[Objective]:
    """``with registered(obj):`` the objective is registered inside the block and removed after it; with
    ``replace=True`` it stands in for the objective of the same name inside the block (e.g. a replacement of
    ``cross-entropy`` that fit then uses), which is back after it."""
    with OBJECTIVES.registered(objective.name, objective, replace=replace):
        yield objective


def get(name: str, *, harden_method: bool = False) -> Objective:
    """The objective registered as ``name`` (any case, ``_`` or ``-``); with ``harden_method``, only one offered
    as a harden method. A one-line ConfigError naming the harden methods otherwise."""
    obj = OBJECTIVES.get(name) if name in OBJECTIVES else None
    if obj is None or (harden_method and not obj.harden_method):
        other = "" if obj is None else f" ({obj.name} is the training objective of another loop)"
        raise ConfigError(f"unknown harden method {name!r}{other}: choose one of {', '.join(names())}")
    return obj


def names(*, harden_only: bool = True) -> tuple[str, ...]:
    """The registered harden methods' names (every objective's with ``harden_only=False``), in registration
    order."""
    return tuple(name for name, obj in OBJECTIVES.items() if obj.harden_method or not harden_only)


def option_owners() -> dict[str, tuple[tuple[str, ...], Option]]:
    """Every method-specific option name of the harden methods -> (the methods that take it, the first one's
    :class:`Option`), in registration order."""
    owners: dict[str, tuple[tuple[str, ...], Option]] = {}
    for _, obj in OBJECTIVES.items():
        if not obj.harden_method:
            continue
        for opt in obj.options:
            prev = owners.get(opt.name)
            owners[opt.name] = ((*prev[0], obj.name), prev[1]) if prev else ((obj.name,), opt)
    return owners
