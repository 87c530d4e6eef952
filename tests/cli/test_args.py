"""The flags generated from option records (robustest.cli.args.add_option_args): Recipe's fields."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from robustest.cli import build_parser
from robustest.cli.args import add_option_args, options_from_args
from robustest.cli.settings import option_settings
from robustest.core.options import option
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


@dataclasses.dataclass(frozen=True)
class _Toy:
    eps: float | None = option(None, "radius", "radius", shown="0.3 for grey images")
    pgd_steps: int = option(20, "positive-int", "PGD steps", flag="whitebox-pgd-steps")
    limit: int = option(500, "count", "images; 0 skips", metavar="N")
    rate: float = option(0.5, "below-one", "a share")
    fast: bool = option(False, "flag", "go fast")
    start: bool | None = option(None, "switch", "random start", shown="pgd yes")
    mode: str = option("a", "choice", "mode", choices=lambda: ("a", "b"))
    seed: int = 0


def _toy(**kw) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_option_args(p, _Toy, **kw)
    return p


def test_any_option_record_gives_flags_with_its_defaults_and_flag_names():
    ns = _toy().parse_args([])
    assert vars(ns) == {"eps": None, "whitebox_pgd_steps": 20, "limit": 500, "rate": 0.5, "fast": False,
                        "start": None, "mode": "a"}
    given = _toy().parse_args(["--eps", "8/255", "--whitebox-pgd-steps", "3", "--limit", "0", "--rate", "0.25",
                               "--fast", "--no-start", "--mode", "b"])
    assert options_from_args(_Toy, given) == {"eps": 8 / 255, "pgd_steps": 3, "limit": 0, "rate": 0.25, "fast": True,
                                              "start": False, "mode": "b"}
    assert options_from_args(_Toy, given, ("pgd_steps",)) == {"pgd_steps": 3}
    assert option_settings(_Toy, given, ("pgd_steps", "limit")) == {"whitebox_pgd_steps": 3, "limit": 0}
    assert list(option_settings(_Toy, given)) == ["eps", "whitebox_pgd_steps", "limit", "rate", "fast", "start", "mode"]


def test_the_help_states_each_default_as_the_record_says():
    text = " ".join(_toy(defaults={"limit": 100}).format_help().split())
    for part in ("radius (default: 0.3 for grey images)", "PGD steps (default: 20)", "images; 0 skips (default: 100)",
                 "a share (default: 0.5)", "random start (default: pgd yes)", "mode (default: a)", "--limit N"):
        assert part in text
    assert "go fast (default" not in text
    assert _toy(defaults={"limit": 100}).parse_args([]).limit == 100
    assert vars(_toy(names=("mode",), unset=True).parse_args([])) == {"mode": None}


@pytest.mark.parametrize("flag, value", [("--whitebox-pgd-steps", "0"), ("--limit", "-1"), ("--rate", "1"),
                                         ("--mode", "c"), ("--eps", "x")])
def test_each_kind_checks_its_value(flag, value):
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _toy().parse_args([flag, value])


@dataclasses.dataclass(frozen=True)
class _Aliased:
    width: float = option(0.2, "noise-width", "noise width", flag="noise-width", aliases=("eps", "w"))
    batch: int | str | None = option(None, "batch-size", "batch")


def test_an_alias_fills_the_same_option_and_a_batch_size_may_be_auto():
    p = argparse.ArgumentParser(exit_on_error=False)
    add_option_args(p, _Aliased)
    for argv in (["--noise-width", "0.5"], ["--eps", "0.5"], ["--w", "1/2"]):
        assert options_from_args(_Aliased, p.parse_args(argv)) == {"width": 0.5, "batch": None}
    assert options_from_args(_Aliased, p.parse_args(["--batch", "auto"]))["batch"] == "auto"
    assert options_from_args(_Aliased, p.parse_args(["--batch", "7"]))["batch"] == 7
    assert "--noise-width W, --eps W, --w W" not in p.format_help()  # no metavar: the flag's own name
    assert "--noise-width NOISE_WIDTH, --eps NOISE_WIDTH, --w NOISE_WIDTH" in p.format_help()
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        p.parse_args(["--batch", "0"])


def test_a_size_takes_two_positive_integers_and_the_data_flags_are_the_loaders_options():
    from robustest import data as datasets
    from robustest.cli.args import LOADER_FLAGS

    ns = build_parser().parse_args(["corrupt", "--dataset", "digits", "--out", "o", "--resize", "32", "30",
                                    "--center-crop", "28", "28", "--limit", "5"])
    assert options_from_args(datasets.LoadOptions, ns, LOADER_FLAGS) == {
        "limit": 5, "num_classes": None, "corruption": None, "severity": None, "resize": [32, 30],
        "center_crop": [28, 28], "workers": 0}
    plain = build_parser().parse_args(["corrupt", "--dataset", "digits", "--out", "o"])
    assert datasets.LoadOptions(**options_from_args(datasets.LoadOptions, plain, LOADER_FLAGS)) == \
        datasets.LoadOptions()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["corrupt", "--dataset", "digits", "--out", "o", "--resize", "32", "0"])


def test_analyze_and_validate_read_the_analysis_options_defaults():
    from robustest.weakrobust.analyze_pipeline import AnalysisOptions

    for verb in ("analyze", "validate"):
        ns = build_parser().parse_args([verb, "--checkpoint", "m.pt", "--dataset", "digits", "--out", "o"])
        assert AnalysisOptions(**options_from_args(AnalysisOptions, ns)) == AnalysisOptions()


def test_harden_and_generate_read_their_records_defaults():
    """The library default and the flag's cannot drift: both come from the record."""
    from robustest.fuzzing.generate import GenerateOptions
    from robustest.train.harden_pipeline import Measurement

    h = build_parser().parse_args(HARDEN)
    m = Measurement(eps=0.3, **options_from_args(Measurement, h))
    assert m == Measurement(eps=0.3)
    assert (h.whitebox_limit, h.whitebox_pgd_steps, h.whitebox_restarts, h.apgd_steps, h.autoattack) == (
        500, 20, 2, 50, None)
    g = build_parser().parse_args(["generate", "--checkpoint", "m.pt", "--dataset", "digits", "--method", "cw",
                                   "--out", "o"])
    opts = options_from_args(GenerateOptions, g)
    assert GenerateOptions(method="cw", **{**opts, "norm": "linf"}) == GenerateOptions(method="cw")
    assert g.norm is None  # resolved from the attack's record by the verb


def test_a_verb_states_its_own_default_where_the_options_differs():
    """harden's SGD runs without Nesterov: its help says so, while the flag stays unset (None) when left out."""
    p = argparse.ArgumentParser(exit_on_error=False)
    add_option_args(p, Recipe, ("momentum", "nesterov"), unset=True, shown={"nesterov": "off"})
    assert vars(p.parse_args([])) == {"momentum": None, "nesterov": None}
    text = " ".join(p.format_help().split())
    assert "Nesterov momentum for SGD (default: off)" in text and "SGD momentum (default: 0.9)" in text
    harden_help = " ".join(build_parser()._subparsers._group_actions[0].choices["harden"].format_help().split())
    assert "Nesterov momentum for SGD (default: off)" in harden_help
