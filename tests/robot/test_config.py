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


def test_layered_takes_the_files_content_as_well_as_its_path(tmp_path):
    """run reads its --config once and hands the content over: the same layers as from the path."""
    path = tmp_path / "c.yaml"
    path.write_text("rounds: 2\nepochs: 4\n")
    layers = ({"rounds": 5, "lr": 0.01}, {"epochs": None, "seed": 3})
    from_path = RobotConfig.layered(path, *layers)
    from_content = RobotConfig.layered({"rounds": 2, "epochs": 4}, *layers)
    assert from_path == from_content
    assert (from_content.rounds, from_content.epochs, from_content.lr, from_content.seed) == (2, 4, 0.01, 3)


def test_the_config_hands_its_training_recipes_over_as_recipes():
    from robustest.train import Recipe

    cfg = RobotConfig(lr=0.002, finetune_options={"schedule": "step", "milestones": [2], "eps_warmup": 0.5},
                      train_options={"optimizer": "sgd", "lr": 0.1, "batch_size": 32, "momentum": 0.8})
    assert cfg.finetune_recipe() == Recipe(lr=0.002, schedule="step", milestones=[2])  # eps_warmup is harden's
    assert cfg.train_recipe() == Recipe(optimizer="sgd", lr=0.1, momentum=0.8)  # batch_size is the fit's
    assert RobotConfig(lr=0.004).train_recipe() == Recipe(lr=0.004)  # train_options' lr defaults to lr
    with pytest.raises(ConfigError, match=r"^finetune_options: momentum and nesterov are options of "
                                          r"optimizer='sgd', not 'adam'"):
        RobotConfig(finetune_options={"momentum": 0.5}).validate()


@pytest.mark.parametrize("kw, match", [
    ({"epochs": 2, "finetune_options": {"schedule": "step", "milestones": [3]}},
     r"^finetune_options: milestones must be a number in \(0, 2"),
    ({"epochs": 1, "finetune_options": {"warmup_epochs": 1}},
     r"^finetune_options: warmup_epochs must be below the number of epochs \(1\), got 1$"),
    ({"train_epochs": 3, "train_options": {"warmup_epochs": 3}},
     r"^train_options: warmup_epochs must be below the number of epochs \(3\)"),
    ({"strategy": "random", "finetune_options": {"lr": 0.1}},
     r"^finetune_options: unknown option .lr.: valid options are amp, augment, "),
    ({"train_options": {"batch_size": 0}}, r"^train_options: batch_size must be an integer >= 1, got 0$"),
    ({"train_options": {"batch_size": True}}, r"^train_options: batch_size must be an integer >= 1, got True$"),
    ({"train_options": {"batch_size": 2.5}}, r"^train_options: batch_size must be an integer >= 1, got 2.5$"),
])
def test_the_recipes_of_a_config_are_checked_for_its_epochs(kw, match):
    with pytest.raises(ConfigError, match=match):
        RobotConfig(**kw).validate()
    assert RobotConfig(train_options={"batch_size": 32, "lr": 0.1}).validate().train_recipe().lr == 0.1
    assert RobotConfig(train_options={"batch_size": 1}).validate().train_options == {"batch_size": 1}
