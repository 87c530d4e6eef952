"""The one registry shape: every kind of thing robustest looks up by name (attacks, selection strategies, training
objectives, ...) lives in a :class:`Registry` of records.

A registry maps canonical names to entries (each package's own record type: an attack's function and metadata, a
strategy, an objective), keeps their registration order, resolves aliases and spelling (``canonical``: lower case,
``_`` read as ``-`` or the reverse, as the kind chooses), and refuses an unknown name with one line listing the
known ones. :meth:`Registry.register`, :meth:`Registry.unregister` and the :meth:`Registry.registered` context add
and remove an entry from outside the package; every CLI choice list is read from :meth:`Registry.names`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from robustest.core.errors import ConfigError

__all__ = ["Registry"]

T = TypeVar("T")


def _lower(name: str) -> str:
    return str(name).lower()


class Registry(Generic[T]):
    """Entries of one kind by name, in registration order.

    ``kind``: what the entries are, for messages ("attack", "selection strategy"); ``canonical``: the spelling
    every name is stored and looked up in (default: lower case); ``entry_type``: the record class an entry must
    be (checked on :meth:`register`)."""

    def __init__(self, kind: str, *, canonical: Callable[[str], str] = _lower,
                 entry_type: type | None = None) -> None:
        self.kind = kind
        self.canonical = canonical
        self.entry_type = entry_type
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def key(self, name: str) -> str:
        """The registered name ``name`` stands for (its canonical spelling, an alias resolved); not checked."""
        key = self.canonical(name)
        return self._aliases.get(key, key)

    def register(self, name: str, entry: T, *, aliases: tuple[str, ...] = (), replace: bool = False) -> T:
        """Add ``entry`` as ``name`` (canonical spelling, after the entries already there) with other spellings
        ``aliases``; a name already taken needs ``replace=True``. Returns ``entry``."""
        if self.entry_type is not None and not isinstance(entry, self.entry_type):
            raise ConfigError(f"a {self.kind} entry must be a {self.entry_type.__name__}, got "
                              f"{type(entry).__name__}")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"a {self.kind} needs a name, got {name!r}")
        key = self.canonical(name)
        if key != name:
            raise ConfigError(f"{self.kind} names are spelled {key!r}, got {name!r}")
        taken = [a for a in (key, *map(self.canonical, aliases)) if a in self._entries or a in self._aliases]
        if taken and not replace:
            raise ConfigError(f"a {self.kind} named {taken[0]!r} is already registered: pick another name or pass "
                              "replace=True")
        self._entries[key] = entry
        for a in map(self.canonical, aliases):
            if a != key:
                self._aliases[a] = key
        return entry

    def unregister(self, name: str) -> T:
        """Remove the entry ``name`` (and its aliases) and return it; ConfigError when there is none."""
        key = self.key(name)
        entry = self.get(name)
        del self._entries[key]
        self._aliases = {a: k for a, k in self._aliases.items() if k != key}
        return entry

    @contextmanager
    def registered(self, name: str, entry: T, *, aliases: tuple[str, ...] = (), replace: bool = False
                   ) -> Iterator[T]:
        """``with registry.registered(name, entry):`` the entry is registered inside the block only; with
        ``replace=True`` it stands in for the entry of the same name, which is back after the block."""
        key = self.canonical(name)
        previous = self._entries.get(key) if replace else None
        old_aliases = dict(self._aliases)
        self.register(name, entry, aliases=aliases, replace=replace)
        try:
            yield entry
        finally:
            if previous is not None:
                self._entries[key] = previous
            elif self._entries.get(key) is entry:
                del self._entries[key]
            self._aliases = old_aliases

    def get(self, name: str) -> T:
        """The entry registered as ``name`` (any spelling ``canonical`` maps to it, or an alias); a one-line
        ConfigError naming the registered ones otherwise."""
        key = self.key(name)
        if key not in self._entries:
            raise ConfigError(f"unknown {self.kind} {name!r}: choose one of {', '.join(self._entries)}")
        return self._entries[key]

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) pairs in registration order."""
        return list(self._entries.items())

    def aliases(self) -> dict[str, str]:
        """Every alias -> the name it stands for."""
        return dict(self._aliases)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.key(name) in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind}: {', '.join(self._entries)})"
