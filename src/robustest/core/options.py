"""Options that carry their command line: a dataclass field made by :func:`option` records how a flag reads its
value (``kind``), its help, its choices, the name its help gives the value (``metavar``), the flag's name when it is
not the field's, and how the help states the default. The records of options (:class:`robustest.train.recipes.Recipe`,
:class:`robustest.fuzzing.generate.GenerateOptions`, :class:`robustest.train.harden_pipeline.Measurement`) are
written once, and the verbs generate their flags from them (:func:`robustest.cli.args.add_option_args`),
so a library default and its flag's default cannot drift apart.

Example::

    @dataclass(frozen=True)
    class Attack:
        steps: int = option(10, "positive-int", "attack steps")
        norm: str = option("linf", "choice", "threat model", choices=("linf", "l2"))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from robustest.core.errors import ConfigError

__all__ = ["KINDS", "flag_name", "option", "option_default", "option_fields"]

#: how a flag reads an option's value: a float that is finite ("number"), > 0 ("positive"), >= 0 ("non-negative"),
#: in [0, 1) ("below-one"), in [0, 1] ("unit"), a learning rate ("rate"), a radius ("radius": L-inf in (0, 1] or
#: L2 > 0; "linf-eps": L-inf only), an int >= 0 ("count") or >= 1 ("positive-int"), a seed ("seed"), a comma list
#: of epochs ("epochs"), a string ("text"), a JSON object ("json"), one of ``choices`` ("choice"),
#: ``--name/--no-name`` ("switch"), or ``--name`` alone ("flag")
KINDS = ("number", "positive", "non-negative", "below-one", "unit", "rate", "radius", "linf-eps", "count",
         "positive-int", "seed", "epochs", "text", "json", "choice", "switch", "flag")


def option(default: Any, kind: str, help: str, *, choices: Sequence[str] | Callable[[], Sequence[str]] | None = None,
           metavar: str | None = None, flag: str | None = None, shown: str | None = None) -> Any:
    """A dataclass field holding ``default``, with what a command line needs to offer it.

    ``kind``: one of :data:`KINDS`; ``help``: the flag's help, without its default; ``choices``: a choice's values
    (or a function returning them, for a registry's names read when the flag is made);
    ``metavar``: the value's name in the help; ``flag``: the flag's name without dashes (default: the field's name
    with ``-`` for ``_``); ``shown``: the default as the help states it (default: the value; nothing for None).
    A ``default`` that is a type (``dict``, ``list``) is the field's default factory: each instance gets its own."""
    if kind not in KINDS:
        raise ConfigError(f"unknown option kind {kind!r}: use one of {', '.join(KINDS)}")
    if (kind == "choice") != (choices is not None):
        raise ConfigError("an option of kind 'choice' needs its choices, and only it takes them")
    if choices is not None and not callable(choices):
        choices = tuple(choices)
    meta = {"kind": kind, "help": help, "choices": choices, "metavar": metavar,
            "flag": flag, "shown": shown}
    if isinstance(default, type):
        return dataclasses.field(default_factory=default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def option_fields(cls: type, names: Sequence[str] | None = None) -> list[dataclasses.Field]:
    """The fields of the dataclass ``cls`` made by :func:`option`, in declaration order (``names``: only those, in
    that order)."""
    found = [f for f in dataclasses.fields(cls) if "kind" in f.metadata]
    if names is not None:
        unknown = sorted(set(names) - {f.name for f in found})
        if unknown:
            raise ConfigError(f"{cls.__name__} has no option {', '.join(unknown)}")
        by_name = {f.name: f for f in found}
        found = [by_name[n] for n in names]
    return found


def flag_name(f: dataclasses.Field) -> str:
    """The flag of the option field ``f`` without its dashes: its ``flag``, else its name with ``-`` for ``_``."""
    return f.metadata["flag"] or f.name.replace("_", "-")


def option_default(f: dataclasses.Field) -> Any:
    """The default of the option field ``f`` (a fresh one from its factory, if it has one)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default
