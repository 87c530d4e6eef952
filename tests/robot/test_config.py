"""The RobOT config's layers (robustest.robot.config.RobotConfig.layered)."""

from __future__ import annotations

import pytest

from robustest.core.errors import ConfigError
from robustest.robot import RobotConfig


def test_file_then_defaults_for_what_it_leaves_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("eps: 0.2\nrounds: 4\ntrain-limit: 100\n")
    cfg = RobotConfig.layered(path, defaults={"rounds": 9, "epochs": 3, "train_limit": 7},
                              overrides={"eps": 0.1, "seed": None})
    assert (cfg.eps, cfg.rounds, cfg.epochs, cfg.train_limit, cfg.seed) == (0.1, 4, 3, 100, RobotConfig().seed)
    assert RobotConfig.layered(None, {"rounds": 9}, {"rounds": 2}).rounds == 2
    assert RobotConfig.layered().to_dict() == RobotConfig().to_dict()


def test_the_layers_are_validated_together(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("eps: 0.2\n")
    with pytest.raises(ConfigError):
        RobotConfig.layered(path, overrides={"eps": 5.0})
    with pytest.raises(ConfigError, match="unknown config key 'bogus'"):
        RobotConfig.layered(None, overrides={"bogus": 1})
