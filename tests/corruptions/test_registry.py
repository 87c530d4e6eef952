"""The corruption registry (robustest.corruptions.spec): the built-in records carry the published parameters and
order, and a corruption registered from outside runs by name in corrupt(), the groups, corruption accuracy and
the corrupt verb."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from robustest import corruptions as corr
from robustest.cli import main
from robustest.core.errors import ConfigError
from robustest.corruptions import CorruptionSpec


def darken(x: torch.Tensor, c: float, gen: torch.Generator, table: str) -> torch.Tensor:
    """A toy corruption: every value scaled by (1 - c)."""
    return x * (1 - c)


DARKEN = CorruptionSpec("darken", darken, "every value times (1 - c)",
                        {"cifar": [0.1, 0.2, 0.3, 0.4, 0.5], "imagenet": [0.2, 0.3, 0.4, 0.5, 0.6]},
                        family="digital", aliases=("dim",))


def test_the_built_in_records_are_the_published_benchmark():
    specs = [corr.spec_of(n) for n in corr.names()]
    assert [s.number for s in specs] == list(range(19)) and corr.published() == corr.names()
    assert [s.name for s in specs if s.held_out] == ["speckle_noise", "gaussian_blur", "spatter", "saturate"]
    assert all(s.family is None for s in specs if s.held_out)
    assert {f: corr.resolve_names(f) for f in corr.FAMILIES} == {
        "noise": ["gaussian_noise", "shot_noise", "impulse_noise"],
        "blur": ["defocus_blur", "glass_blur", "motion_blur", "zoom_blur"],
        "weather": ["snow", "frost", "fog", "brightness"],
        "digital": ["contrast", "elastic_transform", "pixelate", "jpeg_compression"]}
    assert {s.name for s in specs if s.chunked} == {"motion_blur", "spatter", "glass_blur", "elastic_transform",
                                                     "snow", "frost", "fog"}
    # spot checks against make_cifar_c.py / make_imagenet_c.py
    assert corr.parameters("gaussian_noise", 1, "cifar") == 0.04 and corr.parameters("jpeg", 5, "imagenet") == 7
    assert corr.parameters("elastic", 2, "cifar") == (0.05, 0.2, 0.07)
    assert corr.parameters("snow", 5, "imagenet") == (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55)


@pytest.mark.parametrize("kw, message", [
    ({"fn": None}, "corruption 'bad': fn must be callable, got None"),
    ({"params": {"cifar": [1, 2, 3, 4, 5]}}, "corruption 'bad': params['imagenet'] must hold the parameters of "
                                              "severities 1-5 (five entries)"),
    ({"params": {"cifar": [1, 2], "imagenet": [1, 2, 3, 4, 5]}}, "corruption 'bad': params['cifar'] must hold"),
    ({"family": "colour"}, "corruption 'bad': family must be one of noise, blur, weather, digital or None, got "
                           "'colour'"),
])
def test_a_malformed_record_is_refused_with_one_line(kw, message):
    fields = {"name": "bad", "fn": darken, "description": "d", "params": DARKEN.params, **kw}
    with pytest.raises(ConfigError) as exc:
        CorruptionSpec(**fields)
    assert str(exc.value).startswith(message)


def test_a_registered_corruption_runs_by_name_and_joins_its_family():
    x = torch.full((2, 1, 4, 4), 0.5)
    with corr.registered(DARKEN):
        assert corr.names()[-1] == "darken" and "darken" not in corr.published()
        assert torch.allclose(corr.corrupt(x, "DIM", 2), torch.full_like(x, 0.4))  # cifar table for 4 px
        assert torch.allclose(corr.corrupt(x, "darken", 2, table="imagenet"), torch.full_like(x, 0.35))
        assert corr.resolve_names("digital")[-1] == "darken" and "darken" in corr.resolve_names("common")
        assert corr.describe("darken") == "every value times (1 - c)"
        assert corr.get_corruption_names("digital") == ["contrast", "elastic_transform", "pixelate",
                                                        "jpeg_compression"]  # imagecorruptions' list stays
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
        res = __import__("robustest.evaluate", fromlist=["corruption_accuracy"]).corruption_accuracy(
            model, (x, torch.tensor([0, 1])), corruptions="darken", severities=(1, 5))
        assert sorted(res.accuracy) == ["darken"]
    assert "darken" not in corr.names()
    with pytest.raises(ConfigError, match="^unknown corruption 'darken': choose from gaussian_noise, "):
        corr.corrupt(x, "darken", 1)
    with pytest.raises(ConfigError, match="^register takes a robustest.corruptions.CorruptionSpec, got function"):
        corr.register(darken)  # type: ignore[arg-type]


def test_the_corrupt_verb_writes_a_registered_corruption(tmp_path):
    out = tmp_path / "c"
    with corr.registered(DARKEN):
        assert main(["corrupt", "--dataset", "digits", "--corruptions", "darken", "--severities", "1,5", "--limit",
                     "6", "--out", str(out), "--no-progress"]) == 0
    settings = json.loads((out / "results.json").read_text())["settings"]
    assert settings["corruptions"] == ["darken"] and settings["severities"] == [1, 5]
    stored = np.load(out / "darken.npz")
    assert stored["x_test"].shape[0] == 12  # 6 images x 2 severities
