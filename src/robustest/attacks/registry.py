"""The registry of attacks: an :class:`Attack` record per name, beside its function (each attack module defines
its records in ``RECORDS``), in one :class:`robustest.core.registry.Registry`.

A record carries what other packages need to know about the attack, so none of them branches on its name: the
threat models it runs in, whether it stays inside the eps-ball, the fewest classes it works with, its default
number of steps and whether its loss ignores the scale of the logits. :func:`register` adds one from outside
the package (``robustest eval --attacks``, ``robustest generate --method`` and :func:`robustest.attacks.attack`
then run it); :func:`registered` for the length of a block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from robustest.core.errors import ConfigError
from robustest.core.registry import Registry

__all__ = ["ATTACKS", "Attack", "attack_function", "canonical_name", "describe", "get", "names", "register",
           "registered", "unregister"]

_NORMS = ("linf", "l2")


def canonical_name(name: str) -> str:
    """The registry spelling of attack ``name``: lower case, ``-`` read as ``_``, an alias resolved
    (``apgd-ce`` is ``apgd``, ``cw`` is ``cw_l2``)."""
    get(name)  # unknown: a one-line ConfigError
    return ATTACKS.key(name)


@dataclass(frozen=True)
class Attack:
    """One attack.

    ``fn(model, x, y, eps, ..., seed=None, *, batch_size, generator)``: images N x C x H x W in [0, 1] and labels
    int64 [N] -> adversarial images of the same shape on x's device. ``norms``: the threat models it runs in
    (``fn`` takes ``norm=`` when there are several); ``norm_bounded``: its images stay inside the eps-ball
    (False for minimum-norm searches like C&W); ``min_classes``: the fewest classes of a model it works with
    (APGD-DLR 3, APGD-T 4); ``default_steps``: its iterations when none are given (None: no steps);
    ``scale_free``: its loss does not depend on the scale of the logits, so it sees through saturated
    cross-entropy (DLR, margin and boundary attacks); ``aliases``: other names it answers to.
    """

    name: str
    fn: Callable[..., torch.Tensor]
    description: str
    norms: tuple[str, ...] = _NORMS
    norm_bounded: bool = True
    min_classes: int = 2
    default_steps: int | None = None
    scale_free: bool = False
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigError(f"attack {self.name!r}: fn must be callable, got {self.fn!r}")
        if not self.norms or any(n not in _NORMS for n in self.norms):
            raise ConfigError(f"attack {self.name!r}: norms must be some of {', '.join(_NORMS)}, got {self.norms!r}")
        if isinstance(self.min_classes, bool) or not isinstance(self.min_classes, int) or self.min_classes < 2:
            raise ConfigError(f"attack {self.name!r}: min_classes must be an integer >= 2, got {self.min_classes!r}")


def _spelling(name: str) -> str:
    return str(name).lower().replace("-", "_")


#: every registered attack (the one registry shape of :class:`robustest.core.registry.Registry`)
ATTACKS: Registry[Attack] = Registry("attack", canonical=_spelling, entry_type=Attack)


def register(attack: Attack, *, replace: bool = False) -> Attack:
    """Add ``attack`` under its name and aliases; a taken name needs ``replace=True``. Returns the record."""
    if not isinstance(attack, Attack):
        raise ConfigError(f"register takes a robustest.attacks.Attack, got {type(attack).__name__}")
    return ATTACKS.register(attack.name, attack, aliases=attack.aliases, replace=replace)


def unregister(name: str) -> Attack:
    """Remove attack ``name`` (and its aliases) and return its record."""
    return ATTACKS.unregister(name)


@contextmanager
def registered(attack: Attack, *, replace: bool = False) -> Iterator[Attack]:
    """``with registered(Attack(...)):`` the attack runs by name inside the block only (with ``replace=True`` it
    stands in for the attack of the same name there)."""
    with ATTACKS.registered(attack.name, attack, aliases=attack.aliases, replace=replace):
        yield attack


def get(name: str) -> Attack:
    """The :class:`Attack` registered as ``name`` (any case, ``-`` or ``_``, or an alias)."""
    return ATTACKS.get(name)


def names() -> list[str]:
    """Names of the registered attacks, sorted."""
    return sorted(ATTACKS.names())


def describe(name: str) -> str:
    """One-line description of attack ``name``."""
    return get(name).description


def attack_function(name: str) -> Callable[..., torch.Tensor]:
    """The function of attack ``name`` (``fn(model, x, y, eps, ...)`` -> N x C x H x W adversarial images)."""
    return get(name).fn
