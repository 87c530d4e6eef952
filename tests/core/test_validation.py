"""The validation layer feeds argparse: a flag accepts exactly what the keyword argument accepts."""

from __future__ import annotations

import argparse

import pytest

from robustest.cli import args as cli_args
from robustest.core.errors import ConfigError
from robustest.core.validation import MAX_MAGNITUDE, arg, check_eps, check_float, check_int, check_seed


def _refused(parse, text: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        parse(text)
    return str(exc.value)


def test_arg_reads_integers_numbers_and_fractions_through_the_check() -> None:
    assert arg(check_int, "a positive integer", lo=1)("3") == 3
    assert arg(check_float, "a number in [0, 1]", lo=0, hi=1)("8/255") == pytest.approx(8 / 255)
    assert arg(check_seed, "a seed")("0") == 0
    assert arg(check_eps, norm="linf")("8/255") == pytest.approx(8 / 255)


def test_arg_errors_name_what_is_allowed_and_the_text_given() -> None:
    pos = arg(check_int, "a positive integer", lo=1)
    assert _refused(pos, "3.0") == "expected a positive integer, got '3.0'"
    assert _refused(pos, "0") == "expected a positive integer, got 0"
    unit = arg(check_float, "a number in [0, 1]", lo=0, hi=1)
    assert _refused(unit, "1.5") == "expected a number in [0, 1], got 1.5"
    assert _refused(unit, "nan") == "expected a number in [0, 1] (finite), got 'nan'"
    assert _refused(unit, "1/0").startswith("expected a number in [0, 1], got '1/0'")
    big = arg(check_float, "a number")
    assert "no larger than" in _refused(big, str(10 * MAX_MAGNITUDE))
    # without ``what`` the check's own line is kept (the radius checks explain the pixel scale)
    assert _refused(arg(check_eps, norm="linf"), "8") == (
        "must lie in (0, 1] for the L-inf threat model (pixel scale: 8/255 = 0.031), got 8")


def test_cli_number_types_accept_what_the_keyword_checks_accept() -> None:
    """Each CLI type and its check agree on a grid of values (both accept or both refuse)."""
    cases = [
        (cli_args.positive_int, lambda v: check_int("v", v, lo=1), [0, 1, 5, -2]),
        (cli_args.fraction, lambda v: check_float("v", v, lo=0, hi=1, lo_open=True), [0.0, 0.5, 1.0, 1.5]),
        (cli_args.below_one, lambda v: check_float("v", v, lo=0, hi=1, hi_open=True), [0.0, 0.9, 1.0]),
        (cli_args.seed_int, lambda v: check_seed("v", v), [0, 2**63 - 1, 2**63, -1]),
        (cli_args.significance, lambda v: check_float("v", v, lo=0, hi=1, lo_open=True, hi_open=True),
         [0.0, 0.05, 1.0]),
    ]
    for parse, check, values in cases:
        for v in values:
            try:
                check(v)
                ok = True
            except ConfigError:
                ok = False
            if ok:
                assert parse(str(v)) == v
            else:
                with pytest.raises(argparse.ArgumentTypeError):
                    parse(str(v))
