"""Option records (robustest.core.options): a dataclass field that carries its flag."""

from __future__ import annotations

import dataclasses

import pytest

from robustest.core.errors import ConfigError
from robustest.core.options import KINDS, flag_name, option, option_default, option_fields


@dataclasses.dataclass(frozen=True)
class Toy:
    name: str
    steps: int = option(10, "positive-int", "attack steps")
    norm: str = option("linf", "choice", "threat model", choices=("linf", "l2"), metavar="N")
    pgd_restarts: int = option(2, "count", "restarts", flag="whitebox-restarts", shown="two")
    plain: int = 0


def test_an_option_is_a_field_with_its_default_and_its_flag():
    t = Toy("a")
    assert (t.steps, t.norm, t.pgd_restarts, t.plain) == (10, "linf", 2, 0)
    f = {x.name: x for x in dataclasses.fields(Toy)}
    assert dict(f["norm"].metadata) == {"kind": "choice", "help": "threat model", "choices": ("linf", "l2"),
                                        "metavar": "N", "flag": None, "shown": None}
    assert dict(f["pgd_restarts"].metadata) == {"kind": "count", "help": "restarts", "choices": None, "metavar": None,
                                                "flag": "whitebox-restarts", "shown": "two"}


def test_option_fields_are_the_marked_fields_in_order_or_the_names_asked_for():
    assert [f.name for f in option_fields(Toy)] == ["steps", "norm", "pgd_restarts"]
    assert [f.name for f in option_fields(Toy, ("pgd_restarts", "steps"))] == ["pgd_restarts", "steps"]
    with pytest.raises(ConfigError, match="^Toy has no option name, plain$"):
        option_fields(Toy, ("steps", "plain", "name"))


def test_flag_name_is_the_fields_name_with_dashes_unless_given():
    by = {f.name: f for f in option_fields(Toy)}
    assert flag_name(by["pgd_restarts"]) == "whitebox-restarts"
    assert flag_name(by["steps"]) == "steps"


def test_a_choice_needs_its_choices_and_only_a_choice_takes_them():
    with pytest.raises(ConfigError, match="kind 'choice' needs its choices"):
        option("a", "choice", "x")
    with pytest.raises(ConfigError, match="kind 'choice' needs its choices"):
        option(1, "count", "x", choices=("1",))
    with pytest.raises(ConfigError, match="^unknown option kind 'int': use one of number, positive, "):
        option(1, "int", "x")
    assert "switch" in KINDS and "flag" in KINDS and len(KINDS) == 17


def test_choices_from_a_function_are_kept_to_be_read_late():
    def names():
        return ("a", "b")

    fld = option("a", "choice", "x", choices=names)
    assert fld.metadata["choices"] is names
    assert option("a", "choice", "x", choices=["a", "b"]).metadata["choices"] == ("a", "b")


def test_a_type_as_default_is_a_factory_each_instance_gets_its_own():
    @dataclasses.dataclass
    class WithDict:
        extra: dict = option(dict, "json", "extra options")

    a, b = WithDict(), WithDict()
    a.extra["k"] = 1
    assert b.extra == {} and option_default(option_fields(WithDict)[0]) == {}
    assert option_default(option_fields(Toy, ("steps",))[0]) == 10
