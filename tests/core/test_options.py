"""Options that carry their command line (robustest.core.options): dataclass fields and function parameters."""

from __future__ import annotations

import dataclasses

import pytest

from robustest.core.errors import ConfigError
from robustest.core.options import KINDS, Option, option, options_of, spec


@dataclasses.dataclass(frozen=True)
class Toy:
    name: str
    steps: int = option(10, "positive-int", "attack steps")
    norm: str = option("linf", "choice", "threat model", choices=("linf", "l2"), metavar="N")
    pgd_restarts: int = option(2, "count", "restarts", flag="whitebox-restarts", shown="two")
    plain: int = 0


def search(model, x, *, width: int = 4, depth: int | None = None, quiet: bool = False):
    return width


SEARCH = {"depth": spec("positive-int", "levels", shown="all"), "width": spec("count", "beam width",
                                                                             flag="beam")}


def test_an_option_field_holds_its_default_and_its_spec():
    t = Toy("a")
    assert (t.steps, t.norm, t.pgd_restarts, t.plain) == (10, "linf", 2, 0)
    f = {x.name: x for x in dataclasses.fields(Toy)}
    assert dict(f["norm"].metadata) == {"kind": "choice", "help": "threat model", "choices": ("linf", "l2"),
                                        "metavar": "N", "flag": None, "shown": None, "aliases": ()}


def test_the_options_of_a_dataclass_are_its_marked_fields_in_order_or_the_names_asked_for():
    assert options_of(Toy) == [
        Option("steps", 10, "positive-int", "attack steps", None, None, None, None),
        Option("norm", "linf", "choice", "threat model", ("linf", "l2"), "N", None, None),
        Option("pgd_restarts", 2, "count", "restarts", None, None, "whitebox-restarts", "two")]
    assert [o.name for o in options_of(Toy, ("pgd_restarts", "steps"))] == ["pgd_restarts", "steps"]
    with pytest.raises(ConfigError, match="^Toy has no option name, plain$"):
        options_of(Toy, ("steps", "plain", "name"))


def test_the_options_of_a_function_take_their_defaults_from_its_signature():
    found = options_of((search, SEARCH))
    assert [(o.name, o.default, o.kind, o.shown) for o in found] == [("width", 4, "count", None),
                                                                     ("depth", None, "positive-int", "all")]
    with pytest.raises(ConfigError, match="^search has no option quiet$"):
        options_of((search, SEARCH), ("quiet",))
    with pytest.raises(ConfigError, match="^search has no parameter breadth to describe$"):  # a spec's typo
        options_of((search, {**SEARCH, "breadth": spec("count", "x")}))


def test_the_librarys_option_specs_name_real_parameters():
    """Every spec mapping beside a function describes parameters that function has (its flags exist)."""
    from robustest.evaluate.certification import CERTIFY_OPTIONS, run_certify
    from robustest.evaluate.ensemble import EVALUATE_OPTIONS, evaluate
    from robustest.suite.build import BUILD_OPTIONS, build_suite

    for fn, specs in ((run_certify, CERTIFY_OPTIONS), (evaluate, EVALUATE_OPTIONS), (build_suite, BUILD_OPTIONS)):
        assert [o.name for o in options_of((fn, specs))] and {o.name for o in options_of((fn, specs))} == set(specs)


def test_the_flag_and_the_attribute_it_fills_follow_the_name_unless_the_spec_renames_it():
    by = {o.name: o for o in options_of(Toy) + options_of((search, SEARCH))}
    assert (by["pgd_restarts"].flag_name, by["pgd_restarts"].dest) == ("whitebox-restarts", "whitebox_restarts")
    assert (by["steps"].flag_name, by["steps"].dest) == ("steps", "steps")
    assert (by["width"].flag_name, by["width"].dest) == ("beam", "beam")


def test_a_choice_needs_its_choices_and_only_a_choice_takes_them():
    with pytest.raises(ConfigError, match="kind 'choice' needs its choices"):
        option("a", "choice", "x")
    with pytest.raises(ConfigError, match="kind 'choice' needs its choices"):
        spec("count", "x", choices=("1",))
    with pytest.raises(ConfigError, match="^unknown option kind 'int': use one of number, positive, "):
        spec("int", "x")
    assert "switch" in KINDS and "flag" in KINDS and "batch-size" in KINDS and "size" in KINDS and len(KINDS) == 21


def test_choices_from_a_function_are_kept_to_be_read_late():
    def names():
        return ("a", "b")

    assert option("a", "choice", "x", choices=names).metadata["choices"] is names
    assert spec("choice", "x", choices=["a", "b"])["choices"] == ("a", "b")


def test_a_type_as_default_is_a_factory_each_instance_gets_its_own():
    @dataclasses.dataclass
    class WithDict:
        extra: dict = option(dict, "json", "extra options")

    a, b = WithDict(), WithDict()
    a.extra["k"] = 1
    assert b.extra == {} and options_of(WithDict)[0].default == {}


def test_defaults_of_gives_the_parameters_that_have_a_default():
    from robustest.core.options import defaults_of

    def fn(a, b=2, *args, c=None, d, **kw):  # noqa: ANN001, ANN002, ANN003, ARG001 - a signature to read
        return a

    assert defaults_of(fn) == {"b": 2, "c": None}
    assert defaults_of(lambda: None) == {}


def test_a_checked_option_resolves_its_values_through_its_check():
    from robustest.core.options import checked_option

    seen = []

    def check(v, n):
        seen.append((v, n))
        if v < 0:
            raise ConfigError(f"{n} must be >= 0, got {v}")
        return float(v)

    o = checked_option("beta", 3, check, "weight of the KL term", kind="count", metavar="B")
    assert (o.name, o.default, o.kind, o.help, o.metavar, o.flag_name) == ("beta", 3, "count", "weight of the KL term",
                                                                           "B", "beta")
    assert o.resolve(None) == 3.0 and o.resolve(2) == 2.0 and seen == [(3, "beta"), (2, "beta")]
    with pytest.raises(ConfigError, match=r"^beta must be >= 0, got -1$"):
        o.resolve(-1)
    plain = Option("steps", 10, "positive-int", "attack steps", None, None, None, None)
    assert plain.check is None and plain.resolve(None) == 10 and plain.resolve(4) == 4
    with pytest.raises(ConfigError, match="unknown option kind"):
        checked_option("x", 1, check, "x", kind="integer")


def test_a_checked_option_is_a_number_unless_said():
    from robustest.core.options import checked_option

    assert checked_option("beta", 3.0, lambda v, n: v, "weight").kind == "number"

