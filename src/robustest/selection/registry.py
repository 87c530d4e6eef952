"""The registry of selection strategies: a :class:`Strategy` record per name (what it needs, what it does)
and :func:`register` / :func:`unregister` / :func:`registered` to add one from anywhere."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from robustest.core.errors import ConfigError
from robustest.core.registry import Registry

__all__ = ["INPUTS", "OPTIONS", "STRATEGIES", "Request", "Strategy", "describe", "get", "names", "register",
           "registered", "unregister"]

#: what a strategy's ``scores`` argument holds: ``scores`` real ``[N]``, ``bits`` a BoolTensor ``[N, F]`` of
#: covered coverage cells, ``features`` a float ``[N, D]`` (e.g. penultimate-layer activations)
INPUTS = ("scores", "bits", "features")
#: options of :func:`robustest.selection.select` a strategy may read besides the seed
OPTIONS = ("k", "fill")


@dataclass(frozen=True)
class Request:
    """One selection to make, its inputs already checked.

    ``inputs``: float64 ``[N]`` scores, bool ``[N, F]`` bits or float ``[N, D]`` features (on their own device)
    as the strategy's ``needs`` says; ``n``: how many to pick, ``1 <= n <= N``; ``k``: sections or bins
    (>= 1); ``fill``: ``"total"`` or ``"random"``; ``labels``: int64 ``[N]`` classes or None; ``gen``: the
    seeded CPU generator every random draw comes from.
    """

    inputs: torch.Tensor
    n: int
    k: int
    fill: str
    labels: torch.Tensor | None
    gen: torch.Generator


@dataclass(frozen=True)
class Strategy:
    """A selection strategy.

    ``fn(request) -> indices``: int64 ``[n]`` distinct indices into the pool (any device; ``select`` returns
    them as int64). ``needs``: what ``scores`` must hold (one of :data:`INPUTS`); ``labels``: takes the
    optional class labels ``[N]``; ``options``: which of :data:`OPTIONS` it reads; ``seeded``: it draws at
    random (with ``fill="random"`` a strategy reading ``fill`` draws too); ``reads_scores``: False when only
    the number of scores matters (``random``), so a caller need not compute real scores for it; ``ranking``:
    a plain ranking of whatever score it is given (``top``, ``bottom``), which a pipeline offers under the name
    of the score it ranks.
    """

    name: str
    description: str
    fn: Callable[[Request], torch.Tensor]
    needs: str = "scores"
    labels: bool = False
    options: tuple[str, ...] = ()
    seeded: bool = False
    reads_scores: bool = True
    ranking: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"a selection strategy needs a name, got {self.name!r}")
        if not callable(self.fn):
            raise ConfigError(f"selection strategy {self.name!r}: fn must be callable, got {self.fn!r}")
        if self.needs not in INPUTS:
            raise ConfigError(f"selection strategy {self.name!r}: needs must be one of {', '.join(INPUTS)}, "
                              f"got {self.needs!r}")
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise ConfigError(f"selection strategy {self.name!r}: unknown option {unknown[0]!r}: choose from "
                              f"{', '.join(OPTIONS)}")


#: the registered strategies (the one registry shape of :class:`robustest.core.registry.Registry`)
STRATEGIES: Registry[Strategy] = Registry("selection strategy", canonical=str, entry_type=Strategy)


def register(strategy: Strategy, *, replace: bool = False) -> Strategy:
    """Add ``strategy`` under its name (after those already there); a taken name is a ConfigError unless
    ``replace``. Returns the strategy."""
    if not isinstance(strategy, Strategy):
        raise ConfigError(f"register takes a robustest.selection.Strategy, got {type(strategy).__name__}")
    return STRATEGIES.register(strategy.name, strategy, replace=replace)


def unregister(name: str) -> Strategy:
    """Remove strategy ``name`` from the registry and return it."""
    return STRATEGIES.unregister(name)


@contextmanager
def registered(strategy: Strategy) -> Iterator[Strategy]:
    """``with registered(Strategy(...)):`` the strategy is selectable inside the block only."""
    with STRATEGIES.registered(strategy.name, strategy):
        yield strategy


def get(name: str) -> Strategy:
    """The :class:`Strategy` registered as ``name``."""
    return STRATEGIES.get(name)


def names() -> list[str]:
    """Names of the selection strategies."""
    return STRATEGIES.names()


def describe(name: str) -> str:
    """One line describing strategy ``name``."""
    return f"{name}: {get(name).description}"
