"""The one registry shape (robustest.core.registry.Registry): names in order, spelling and aliases, refusals with
one line, registration from outside and the context that undoes it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from robustest.core.errors import ConfigError
from robustest.core.registry import Registry


@dataclass(frozen=True)
class Thing:
    value: int


def dashed(name: str) -> str:
    return str(name).lower().replace("_", "-")


def make() -> Registry[Thing]:
    r: Registry[Thing] = Registry("widget", canonical=dashed, entry_type=Thing)
    r.register("one", Thing(1), aliases=("uno", "first_one"))
    r.register("two", Thing(2))
    return r


def test_names_keep_registration_order_and_lookups_take_any_spelling():
    r = make()
    assert r.names() == ["one", "two"] and len(r) == 2 and [v.value for _, v in r.items()] == [1, 2]
    assert r.get("ONE") == r.get("uno") == r.get("First_One") == r.get("first-one") == Thing(1)
    assert r.key("Uno") == "one" and r.key("zzz") == "zzz" and r.aliases() == {"uno": "one", "first-one": "one"}
    assert "Two" in r and "three" not in r and 3 not in r
    assert repr(r) == "Registry(widget: one, two)"


def test_unknown_taken_and_misspelt_names_are_one_line_refusals():
    r = make()
    with pytest.raises(ConfigError, match="^unknown widget 'three': choose one of one, two$"):
        r.get("three")
    with pytest.raises(ConfigError, match="^a widget named 'two' is already registered: pick another name or "
                                          "pass replace=True$"):
        r.register("two", Thing(3))
    with pytest.raises(ConfigError, match="^a widget named 'uno' is already registered"):
        r.register("three", Thing(3), aliases=("uno",))
    with pytest.raises(ConfigError, match="^widget names are spelled 'big-one', got 'Big_One'$"):
        r.register("Big_One", Thing(3))
    with pytest.raises(ConfigError, match="^a widget entry must be a Thing, got int$"):
        r.register("three", 3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="^a widget needs a name, got ' '$"):
        r.register(" ", Thing(3))
    assert r.names() == ["one", "two"]  # nothing half-registered


def test_replace_and_unregister():
    r = make()
    r.register("two", Thing(22), replace=True)
    assert r.get("two") == Thing(22) and r.names() == ["one", "two"]
    assert r.unregister("uno") == Thing(1)  # by alias; its aliases go with it
    assert r.names() == ["two"] and r.aliases() == {} and "uno" not in r
    with pytest.raises(ConfigError, match="^unknown widget 'one'"):
        r.unregister("one")


def test_registered_undoes_itself_even_after_an_error():
    r = make()
    with pytest.raises(RuntimeError), r.registered("three", Thing(3), aliases=("tres",)) as t:
        assert t == Thing(3) and r.get("tres") == t and r.names() == ["one", "two", "three"]
        raise RuntimeError("inside")
    assert r.names() == ["one", "two"] and "tres" not in r and r.aliases() == {"uno": "one", "first-one": "one"}
    with r.registered("one", Thing(11), replace=True):
        assert r.get("one") == Thing(11)
    assert r.get("one") == Thing(1) and r.get("uno") == Thing(1)  # the original and its aliases are back


def test_a_registry_without_entry_type_or_spelling_rules_takes_anything():
    r: Registry[object] = Registry("thing")
    r.register("a", 1)
    assert r.get("A") == 1 and r.canonical("Mixed_Case") == "mixed_case"
