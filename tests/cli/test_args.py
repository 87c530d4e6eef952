"""The flags generated from option records (robustest.cli.args.add_option_args): Recipe's fields."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from robustest.cli import build_parser
from robustest.cli.args import add_option_args
from robustest.train.recipes import Recipe

TRAIN = ["train", "--model", "digits_cnn", "--dataset", "digits", "--epochs", "4", "--out", "o"]
HARDEN = ["harden", "--checkpoint", "m.pt", "--dataset", "digits", "--eps", "0.3", "--out", "o"]


def _parser(names=None, defaults=None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_option_args(p, Recipe, names, defaults, unset=True)
    return p


def test_one_flag_per_recipe_field_none_unless_given():
    ns = vars(_parser().parse_args([]))
    assert ns == {f.name: None for f in dataclasses.fields(Recipe)}
    given = _parser().parse_args(["--optimizer", "sgd", "--lr", "0.1", "--no-nesterov", "--milestones", "2,3",
                                  "--schedule", "cyclic", "--compile", "--warmup-epochs", "0.5"])
    assert (given.optimizer, given.lr, given.nesterov, given.milestones, given.schedule, given.compile,
            given.warmup_epochs) == ("sgd", 0.1, False, [2.0, 3.0], "cyclic", True, 0.5)


def test_a_verb_offers_its_subset_with_its_defaults_shown_in_the_help():
    p = _parser(("lr", "nesterov", "schedule"), {"lr": 0.01, "schedule": "cosine"})
    assert vars(p.parse_args([])) == {"lr": 0.01, "nesterov": None, "schedule": "cosine"}
    text = p.format_help()
    assert "(default: 0.01)" in text and "(default: cosine)" in text and "(default: on)" in text
    assert "--momentum" not in text


@pytest.mark.parametrize("flag, value", [("--lr", "0"), ("--lr", "11"), ("--momentum", "1"), ("--weight-decay", "-1"),
                                         ("--label-smoothing", "1"), ("--schedule", "linear"), ("--milestones", "0")])
def test_each_flag_checks_its_value(flag, value):
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _parser().parse_args([flag, value])


def test_train_and_harden_spell_the_recipe_alike():
    """The drift the generated flags end: train takes the cyclic schedule, harden --no-nesterov."""
    p = build_parser()
    assert p.parse_args([*TRAIN, "--schedule", "cyclic"]).schedule == "cyclic"
    assert p.parse_args([*HARDEN, "--optimizer", "sgd", "--no-nesterov"]).nesterov is False
    h = p.parse_args(HARDEN)
    assert (h.lr, h.optimizer, h.schedule, h.weight_decay, h.momentum, h.nesterov) == (1e-3, "adam", "none", 0.0,
                                                                                       None, None)
    t = p.parse_args(TRAIN)
    assert all(getattr(t, f.name) is None for f in dataclasses.fields(Recipe))
