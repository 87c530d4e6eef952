"""The registry of hardening objectives: :func:`register` / :func:`unregister` / :func:`registered` add and remove
one, :func:`get` and :func:`names` are what harden, its settings, the CLI and RobOT's hardening strategies read."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from robustest.core.errors import ConfigError
from robustest.train.objectives.base import Objective, Option

__all__ = ["canonical", "get", "names", "option_owners", "register", "registered", "unregister"]

_REGISTRY: dict[str, Objective] = {}


def canonical(name: str) -> str:
    """The registry spelling of ``name``: lower case, ``_`` read as ``-``."""
    return str(name).lower().replace("_", "-")


def register(objective: Objective, *, replace: bool = False) -> Objective:
    """Add ``objective`` under ``objective.name`` (after the objectives already registered); a second one of the
    same name needs ``replace=True``. Returns ``objective``."""
    if not isinstance(objective, Objective):
        raise ConfigError(f"register takes an Objective, got {type(objective).__name__}")
    name = canonical(objective.name)
    if name != objective.name or not name:
        raise ConfigError(f"objective names are lower case with '-', got {objective.name!r}")
    if name in _REGISTRY and not replace:
        raise ConfigError(f"an objective named {name!r} is already registered: unregister it or pass replace=True")
    _REGISTRY[name] = objective
    return objective


def unregister(name: str) -> Objective:
    """Remove and return the objective ``name`` (ConfigError when there is none)."""
    return _REGISTRY.pop(get(name).name)


@contextmanager
def registered(objective: Objective) -> Iterator[Objective]:
    """``with registered(obj):`` the objective is registered inside the block and removed after it."""
    register(objective)
    try:
        yield objective
    finally:
        _REGISTRY.pop(objective.name, None)


def get(name: str) -> Objective:
    """The objective registered as ``name`` (any case, ``_`` or ``-``); a one-line ConfigError naming the choices."""
    obj = _REGISTRY.get(canonical(name))
    if obj is None:
        raise ConfigError(f"unknown harden method {name!r}: choose one of {', '.join(_REGISTRY)}")
    return obj


def names() -> tuple[str, ...]:
    """The registered objectives' names, in registration order."""
    return tuple(_REGISTRY)


def option_owners() -> dict[str, tuple[tuple[str, ...], Option]]:
    """Every method-specific option name -> (the objectives that take it, the first one's :class:`Option`), in
    registration order."""
    owners: dict[str, tuple[tuple[str, ...], Option]] = {}
    for obj in _REGISTRY.values():
        for opt in obj.options:
            prev = owners.get(opt.name)
            owners[opt.name] = ((*prev[0], obj.name), prev[1]) if prev else ((obj.name,), opt)
    return owners
