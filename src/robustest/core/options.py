"""Options that carry their command line. :func:`spec` records how a flag reads an option's value (``kind``), its
help, its choices, the name its help gives the value (``metavar``), the flag's name when it is not the option's, and
how the help states the default. A dataclass field made by :func:`option` carries its spec (the records
:class:`robustest.train.recipes.Recipe`, :class:`robustest.fuzzing.generate.GenerateOptions`,
:class:`robustest.robot.RobotConfig`); a function's keyword parameters get theirs from a mapping beside it, and
keep their defaults in the signature. The verbs generate their flags from either (:func:`options_of`,
:func:`robustest.cli.args.add_option_args`), so a library default and its flag's default cannot drift apart.

Example::

    @dataclass(frozen=True)
    class Attack:
        steps: int = option(10, "positive-int", "attack steps")
        norm: str = option("linf", "choice", "threat model", choices=("linf", "l2"))

    def search(model, x, *, width: int = 4): ...
    SEARCH_OPTIONS = {"width": spec("positive-int", "beam width")}
    options_of((search, SEARCH_OPTIONS))  # [Option(name="width", default=4, kind="positive-int", ...)]
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from robustest.core.errors import ConfigError

__all__ = ["KINDS", "Option", "OptionSource", "checked_option", "defaults_of", "option", "options_of", "spec"]

#: how a flag reads an option's value: a float that is finite ("number"), > 0 ("positive"), >= 0 ("non-negative"),
#: in [0, 1) ("below-one"), in [0, 1] ("unit"), a learning rate ("rate"), a radius ("radius": L-inf in (0, 1] or
#: L2 > 0; "linf-eps": L-inf only), a noise width in (0, 2] ("noise-width"), a level in (0, 1) ("significance"),
#: an int >= 0 ("count") or >= 1 ("positive-int"), a seed ("seed"), a comma list of epochs ("epochs"), a string
#: ("text"), a JSON object ("json"), a batch size or ``auto`` ("batch-size"), an image size ``H W`` ("size", two
#: positive integers), one of ``choices`` ("choice"), ``--name/--no-name`` ("switch"), or ``--name`` alone ("flag")
KINDS = ("number", "positive", "non-negative", "below-one", "unit", "rate", "radius", "linf-eps", "noise-width",
         "significance", "count", "positive-int", "seed", "epochs", "text", "json", "batch-size", "size", "choice",
         "switch", "flag")


class Option(NamedTuple):
    """One option as a command line offers it: ``name`` (the field's or parameter's), its ``default`` and what
    :func:`spec` records (``kind``, ``help``, ``choices``, ``metavar``, ``flag``, ``shown``, ``aliases``); an option
    that checks its own values (:func:`checked_option`, e.g. a training objective's) also carries ``check(value,
    name)``, which returns the validated value or raises a one-line ConfigError."""

    name: str
    default: Any
    kind: str
    help: str
    choices: Sequence[str] | Callable[[], Sequence[str]] | None
    metavar: str | None
    flag: str | None
    shown: str | None
    aliases: tuple[str, ...] = ()
    check: Callable[[Any, str], Any] | None = None

    def resolve(self, value: Any) -> Any:
        """The value in effect for ``value`` given (None: the default), through :attr:`check` when there is one."""
        v = self.default if value is None else value
        return v if self.check is None else self.check(v, self.name)

    @property
    def flag_name(self) -> str:
        """The flag without its dashes: ``flag``, else the name with ``-`` for ``_``."""
        return self.flag or self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        """The attribute argparse stores the flag's value in: the flag's name with ``_`` for ``-``."""
        return self.flag_name.replace("-", "_")


def checked_option(name: str, default: Any, check: Callable[[Any, str], Any], help: str, kind: str = "number",
                   **details: Any) -> Option:
    """An :class:`Option` that validates its values itself (``check(value, name)``: the value, or a one-line
    ConfigError), declared where no dataclass or signature holds it: the method options of a training objective
    (``kind`` "number", "count" or "switch"; ``details`` as :func:`spec` takes them).

    Example: ``checked_option("beta", 3.0, lambda v, n: check_float(n, v, lo=0.0), "weight of the KL term")``."""
    return Option(name, default, **spec(kind, help, **details), check=check)


def spec(kind: str, help: str, *, choices: Sequence[str] | Callable[[], Sequence[str]] | None = None,
         metavar: str | None = None, flag: str | None = None, shown: str | None = None,
         aliases: Sequence[str] = ()) -> dict[str, Any]:
    """What a command line needs to offer an option, checked: ``kind``: one of :data:`KINDS`; ``help``: the flag's
    help, without its default; ``choices``: a choice's values (or a function returning them, for a registry's names
    read when the flag is made); ``metavar``: the value's name in the help; ``flag``: the flag's name without dashes
    (default: the option's name with ``-`` for ``_``); ``shown``: the default as the help states it (default: the
    value; nothing for None); ``aliases``: other names of the flag, without dashes (an older or a reference code's
    name). A function's options are a mapping of its parameters' names to specs."""
    if kind not in KINDS:
        raise ConfigError(f"unknown option kind {kind!r}: use one of {', '.join(KINDS)}")
    if (kind == "choice") != (choices is not None):
        raise ConfigError("an option of kind 'choice' needs its choices, and only it takes them")
    if choices is not None and not callable(choices):
        choices = tuple(choices)
    return {"kind": kind, "help": help, "choices": choices, "metavar": metavar, "flag": flag, "shown": shown,
            "aliases": tuple(aliases)}


def option(default: Any, kind: str, help: str, **details: Any) -> Any:
    """A dataclass field holding ``default`` with its :func:`spec` (``kind``, ``help`` and the ``details``
    ``choices``, ``metavar``, ``flag``, ``shown``, ``aliases``). A ``default`` that is a type (``dict``, ``list``) is
    the field's default factory: each instance gets its own."""
    meta = spec(kind, help, **details)
    if isinstance(default, type):
        return dataclasses.field(default_factory=default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


#: where options come from: a dataclass whose fields :func:`option` made, or a function with the specs of its
#: parameters (the defaults are the function's own)
OptionSource = type | tuple[Callable[..., Any], Mapping[str, Mapping[str, Any]]]


def defaults_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """The defaults of ``fn``'s parameters that have one, by name: what a call that leaves them out runs with."""
    return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}


def options_of(source: OptionSource, names: Sequence[str] | None = None) -> list[Option]:
    """The options of ``source`` (:data:`OptionSource`), in declaration order (``names``: only those, in that order).
    Raises :class:`ConfigError` for a name that is no option of it."""
    if isinstance(source, tuple):
        fn, specs = source
        params = inspect.signature(fn).parameters
        owner = getattr(fn, "__name__", "the function")
        stray = sorted(set(specs) - set(params))
        if stray:
            raise ConfigError(f"{owner} has no parameter {', '.join(stray)} to describe")
        found = [Option(n, params[n].default, **specs[n]) for n in params if n in specs]
    else:
        found = [Option(f.name, f.default_factory() if f.default is dataclasses.MISSING else f.default,
                        **f.metadata) for f in dataclasses.fields(source) if "kind" in f.metadata]
        owner = source.__name__
    if names is None:
        return found
    by_name = {o.name: o for o in found}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ConfigError(f"{owner} has no option {', '.join(sorted(unknown))}")
    return [by_name[n] for n in names]
