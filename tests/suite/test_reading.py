"""A suite file is read like user input: every stored value is checked for its type and range, images too large
for a model are refused by their shape before they are read, and a baseline model for other images is bad input."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from robustest import cli
from robustest.core.errors import DataError
from robustest.suite import Suite
from robustest.suite import format as suite_format

SHA = "0" * 64


def make_suite(side: int = 8, k: int = 4) -> Suite:
    """A small, consistent suite of ``k`` uint8 1 x side x side images in 2 strata of 10 (no model behind it)."""
    gen = torch.Generator().manual_seed(0)
    stratum = torch.arange(k) * 2 // k
    est = {"value": 0.5, "ci_low": 0.1, "ci_high": 0.9, "std_error": 0.2, "n_eff": 4.0, "df": 2, "level": 0.95}
    meta: dict[str, Any] = {
        "k": k, "n_population": 20, "dataset": "digits", "split": "test", "data_sha256": SHA, "samples_sha256": SHA,
        "stratum_sizes": [10, 10], "stratum_weights": [0.5, 0.5], "stratum_samples": [k // 2, k - k // 2],
        "strata": {"bins": 2, "by_class": False, "requested": 2, "allocation": "proportional",
                   "cells": [{"bin": 0, "class": -1}, {"bin": 1, "class": -1}]},
        "analysis": {"n_neighbors": 20, "eps": 0.5, "noise": "uniform", "quantize": True, "seed": 0},
        "attack": {"eps": 0.1, "norm": "linf", "version": "fast", "n_targets": None, "seed": 0, "batch_size": 256},
        "corruption": {"settings": [], "seed": 0}, "baseline_sha256": SHA,
        "baseline": {"robust_accuracy": dict(est), "clean_accuracy": {**est, "n_eff": float("inf")}},
        "baseline_flags": [], "robustest_version": "0.1.0", "format_version": 1,
    }
    return Suite(x=torch.randint(0, 256, (k, 1, side, side), dtype=torch.uint8, generator=gen),
                 y=torch.arange(k) % 10, index=torch.arange(k), stratum=stratum, score=torch.rand(k, generator=gen),
                 clean=torch.ones(k, dtype=torch.bool), robust=torch.zeros(k, dtype=torch.bool),
                 corruption=torch.zeros(k, 0, dtype=torch.bool), meta=meta)


def with_meta(tmp_path, key: str, value: Any) -> Any:
    """A suite file whose meta value at the dotted ``key`` is ``value`` (its SHA-256 recomputed, as a forger can)."""
    s = make_suite()
    meta = copy.deepcopy(s.meta)
    *parents, last = key.split(".")
    node = meta
    for p in parents:
        node = node[p]
    node[last] = value
    s.meta = meta
    path = tmp_path / "forged.pt"
    s.save(path)
    return path


def test_the_summary_line_states_size_strata_baseline_and_threat_model():
    assert make_suite().summary_line() == ("suite of 4 of 20 samples in 2 strata; baseline robust accuracy 50.0% "
                                           "[10.0, 90.0] (linf eps=0.1, fast)")


def test_a_consistent_suite_loads(tmp_path):
    make_suite().save(tmp_path / "s.pt")
    assert len(Suite.load(tmp_path / "s.pt")) == 4


@pytest.mark.parametrize("key, value, expected", [
    ("n_population", -1, "n_population must be an integer >= 4, got -1"),
    ("n_population", 21, "n_population must be the sum of stratum_sizes (20), got 21"),
    ("n_population", 20.0, "n_population must be an integer >= 4, got 20.0"),
    ("attack.seed", 10**30, f"attack.seed must be a seed: an integer in [0, 2^63), got {10**30}"),
    ("attack.seed", -1, "attack.seed must be a seed: an integer in [0, 2^63), got -1"),
    ("attack.eps", 5.0, "attack.eps must lie in (0, 1] for the L-inf threat model"),
    ("attack.eps", float("nan"), "attack.eps must be a finite number"),
    ("attack.batch_size", 0, "attack.batch_size must be an integer in [1, 1048576], got 0"),
    ("attack.n_targets", True, "attack.n_targets must be an integer"),
    ("attack.version", "slow", "unknown attack.version 'slow'"),
    ("attack.norm", "l7", "unknown attack.norm 'l7'"),
    ("analysis.seed", 2**63, "analysis.seed must be a seed"),
    ("analysis.quantize", "no", "analysis.quantize must be true or false, got 'no'"),
    ("corruption.seed", "0", "corruption.seed must be a seed"),
    ("corruption.settings", [["fog", 9]], "corruption.settings[0] severity must be an integer in [1, 5], got 9"),
    ("corruption", "fog", "corruption must be a mapping, got str"),
    ("stratum_sizes", [10, 0], "stratum_sizes[1] must be an integer >= 1, got 0"),
    ("stratum_weights", [0.5, 2.0], "stratum_weights[1] must be a number in [0, 1], got 2.0"),
    ("strata.cells", [{"bin": 0, "class": -1}], "strata.cells must hold 2 values (one per stratum), got 1"),
    ("baseline_sha256", "abc", "baseline_sha256 must be a SHA-256 digest"),
    ("baseline.robust_accuracy.value", 1.5, "baseline.robust_accuracy.value must be a number in [0, 1], got 1.5"),
    ("k", 5, "k must be an integer in [4, 4], got 5"),
])
def test_every_stored_value_is_checked_for_type_and_range(tmp_path, key, value, expected):
    path = with_meta(tmp_path, key, value)
    with pytest.raises(DataError) as exc:
        Suite.load(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: damaged suite: ") and expected in msg, msg
    assert msg.endswith("rebuild it with 'robustest suite build'") and "\n" not in msg


@pytest.mark.parametrize("key, value, expected", [
    ("n_population", -1, "n_population must be an integer >= 4, got -1"),
    ("attack.seed", 10**30, "attack.seed must be a seed: an integer in [0, 2^63)"),
])
def test_suite_check_refuses_a_forged_value_with_one_line(tmp_path, capsys, key, value, expected):
    path = with_meta(tmp_path, key, value)
    code = cli.main(["suite", "check", "--suite", str(path), "--model", "nope:nope", "--random-init",
                     "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"robustest suite: error: {path}: damaged suite: {expected}"), err
    assert not (tmp_path / "out" / "results.json").exists()


def test_images_too_large_for_a_model_are_refused_before_they_are_read(tmp_path, monkeypatch):
    make_suite(side=1800, k=2).save(tmp_path / "big.pt")  # 1 x 1800 x 1800 = 3.24 M values per image

    def never(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("the images were hashed before their shape was checked")

    monkeypatch.setattr(suite_format, "content_sha256", never)
    with pytest.raises(DataError, match=r"the suite's images are 1x1800x1800 \(3,240,000 values each\), more than "
                                        r"the 3,145,728"):
        Suite.load(tmp_path / "big.pt")


def test_suite_check_with_a_baseline_for_other_images_is_bad_input(tmp_path, capsys):
    from robustest import models
    from robustest.models.checkpoints import save_checkpoint

    make_suite().save(tmp_path / "s.pt")
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "cand.pt", models.create("digits_cnn", input_size=8))
    save_checkpoint(tmp_path / "base16.pt", models.create("digits_cnn", input_size=16))
    code = cli.main(["suite", "check", "--suite", str(tmp_path / "s.pt"), "--checkpoint", str(tmp_path / "cand.pt"),
                     "--baseline", str(tmp_path / "base16.pt"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("robustest suite: error: the baseline model's input shape does not match the suite's "
                          "1x8x8 images ("), err
    assert err.rstrip().endswith("give a baseline model for 1x8x8 images, such as the one the suite was built with")


def test_each_unreadable_suite_says_how_to_get_a_good_one(tmp_path):
    fix = "build one with 'robustest suite build'"
    with pytest.raises(DataError) as exc:
        Suite.load(tmp_path / "missing.pt")
    assert str(exc.value) == f"suite file {str(tmp_path / 'missing.pt')!r} does not exist: {fix}"
    torch.save({"format": "other"}, tmp_path / "other.pt")
    with pytest.raises(DataError) as exc:
        Suite.load(tmp_path / "other.pt")
    assert str(exc.value) == f"{tmp_path / 'other.pt'} is not a robustest suite: {fix}"


def test_a_certified_suite_checks_the_candidates_certificates_at_the_given_level(tmp_path, monkeypatch):
    from robustest.suite import check as check_mod

    s = make_suite()
    s.certified = torch.tensor([True, True, False, True])
    s.meta = {**s.meta, "certify": {"method": "ibp"}}
    s.save(tmp_path / "c.pt")

    def fake(model, x, y, attack, corruption, progress=False, certify=None):
        assert certify == {"method": "ibp"}
        k = len(y)
        return {"clean": torch.ones(k, dtype=torch.bool), "robust": torch.ones(k, dtype=torch.bool),
                "corruption": torch.zeros(k, 0, dtype=torch.bool),
                "certified": torch.tensor([True, False, False, True]), "seconds": {}, "flags": []}

    monkeypatch.setattr(check_mod, "evaluate_outcomes", fake)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    r = check_mod.check_suite(model, tmp_path / "c.pt", level=0.9)
    assert r.certified.value == pytest.approx(0.5) and r.certified.level == 0.9
    assert r.baseline["certified_accuracy"].value == pytest.approx(0.75)
    assert (r.certified_comparison.b, r.certified_comparison.c) == (1, 0)
    assert torch.equal(r.outcomes["certified"], torch.tensor([True, False, False, True]))
