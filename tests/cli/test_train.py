"""``robustest train``: recipe flags, --recipe, zoo model options from the command line, --resume, and models
that do not fit the data refused before any work."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_runner import run_cli
from robustest import models
from robustest.core.errors import ConfigError
from robustest.models.checkpoints import load_checkpoint
from robustest.train import channel_stats, fit


def one_line(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.fixture
def colour_npz(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny.npz"
    np.savez(path, x_train=rng.integers(0, 256, (12, 16, 16, 3), dtype=np.uint8), y_train=np.arange(12) % 3,
             x_test=rng.integers(0, 256, (6, 16, 16, 3), dtype=np.uint8), y_test=np.arange(6) % 3)
    return path


def train_args(npz: Path, out: Path, *extra) -> list:
    return ["train", "--dataset", "npz", "--data-dir", npz, "--out", out, "--no-progress", *extra]


def test_recipe_fills_in_and_flags_override(capsys, colour_npz, tmp_path):
    code, out, err = run_cli(capsys, *train_args(colour_npz, tmp_path / "r", "--model", "wrn-10-1", "--recipe",
                                                 "cifar-sgd", "--epochs", "2", "--batch-size", "8"))
    assert code == 0, err
    rep = json.loads((tmp_path / "r" / "results.json").read_text())
    r = rep["recipe"]
    assert r["name"] == "cifar-sgd" and r["epochs"] == 2 and r["batch_size"] == 8
    assert (r["optimizer"], r["lr"], r["momentum"], r["nesterov"], r["weight_decay"]) == ("sgd", 0.1, 0.9, True, 5e-4)
    assert (r["schedule"], r["augment"], r["decay_norm_bias"], r["amp"], r["compile"]) == \
        ("cosine", "crop-flip", False, None, False)
    assert rep["settings"]["lr"] == 0.1 and rep["settings"]["batch_size"] == 8  # what ran, not None
    assert len(rep["history"]["epochs"]) == 2 and rep["history"]["epochs"][-1]["lr"] == pytest.approx(0.0)
    code, _, err = run_cli(capsys, *train_args(colour_npz, tmp_path / "o", "--model", "wrn-10-1", "--recipe",
                                               "imagenet-sgd", "--epochs", "3", "--optimizer", "adam", "--lr", "0.01",
                                               "--schedule", "cosine", "--augment", "none", "--label-smoothing",
                                               "0.1", "--warmup-epochs", "1"))
    assert code == 0, err
    r = json.loads((tmp_path / "o" / "results.json").read_text())["recipe"]
    assert (r["optimizer"], r["lr"], r["schedule"], r["milestones"], r["augment"]) == \
        ("adam", 0.01, "cosine", None, None)
    assert (r["label_smoothing"], r["warmup_epochs"], r["weight_decay"], r["batch_size"]) == (0.1, 1.0, 1e-4, 256)
    code, _, err = run_cli(capsys, *train_args(colour_npz, tmp_path / "s", "--model", "wrn-10-1", "--recipe",
                                               "robot-cifar", "--epochs", "4", "--batch-size", "6"))
    assert code == 0, err
    r = json.loads((tmp_path / "s" / "results.json").read_text())["recipe"]
    assert r["milestones"] == pytest.approx([2.04, 3.04, 3.64])
    assert r["optimizer"] == "adam" and r["weight_decay"] == 2e-4


def test_without_recipe_flags_training_is_unchanged(capsys, colour_npz, tmp_path):
    code, _, err = run_cli(capsys, *train_args(colour_npz, tmp_path / "a", "--model", "wrn-10-1", "--epochs", "1",
                                               "--batch-size", "4", "--seed", "3"))
    assert code == 0, err
    r = json.loads((tmp_path / "a" / "results.json").read_text())
    assert (r["recipe"]["optimizer"], r["recipe"]["lr"], r["recipe"]["schedule"], r["recipe"]["augment"]) == \
        ("adam", 1e-3, None, None)
    # the same training through the library, as before the recipe flags existed
    from robustest import data

    train = data.load("npz", root=colour_npz, split="train")
    torch.manual_seed(3)
    mean, std = channel_stats(train)
    torch.manual_seed(3)
    ref = models.create("wrn-10-1", num_classes=3, in_channels=3, input_size=16, mean=mean, std=std)
    h = fit(ref, train, epochs=1, batch_size=4, seed=3, progress=False)
    assert r["history"]["epochs"][0]["loss"] == h.last.loss
    got = load_checkpoint(tmp_path / "a" / "model.pt")
    assert all(torch.equal(got.state_dict()[k], v) for k, v in ref.state_dict().items())


def test_model_options_from_the_command_line(capsys, colour_npz, tmp_path):
    code, _, err = run_cli(capsys, *train_args(colour_npz, tmp_path / "w", "--model", "wrn", "--model-option",
                                               "depth=10", "--model-option", "width=1", "--model-options",
                                               '{"dropout": 0.25}', "--epochs", "1"))
    assert code == 0, err
    spec = json.loads((tmp_path / "w" / "results.json").read_text())["model"]
    assert spec["options"] == {"depth": 10, "width": 1, "dropout": 0.25}
    assert load_checkpoint(tmp_path / "w" / "model.pt").robustest_spec["options"]["dropout"] == 0.25
    code, _, err = run_cli(capsys, *train_args(colour_npz, tmp_path / "v", "--model", "vit_tiny", "--model-option",
                                               "patch=8", "--epochs", "1", "--batch-size", "12"))
    assert code == 0, err
    assert json.loads((tmp_path / "v" / "results.json").read_text())["model"]["options"]["patch"] == 8


@pytest.mark.parametrize("extra, pattern", [
    (["--model", "wrn-10-1", "--model-option", "growth=12"], "model 'wrn-10-1' has no option 'growth'"),
    (["--model", "wrn-10-1", "--model-option", "dropout=0.1", "--model-options", '{"dropout": 0.2}'],
     "given twice"),
    (["--model", "wrn-10-1", "--model-option", "dropout=NaN"], "finite"),
    (["--model", "wrn-10-1", "--model-options", '{"dropout": [1]}'], "model option dropout"),
    (["--model", "wrn-10-1", "--model-option", "dropout"], "KEY=VALUE"),
    (["--model", "wrn-10-1", "--model-option", "dropout=1.5"], "dropout"),
    (["--model", "wrn-10-1", "--model-option", "depth=16"], "has depth=10 but depth=16 was given"),
    (["--model", "wrn", "--model-option", "depth=12", "--model-option", "width=1"], "6n+4"),
    (["--model", "vit_tiny", "--model-option", "patch=5"], "patch"),
    (["--model", "wrn-10-1"], "give --epochs"),
    (["--model", "wrn-10-1", "--epochs", "2", "--amp", "fp16"], "amp='fp16' needs a CUDA device"),
    (["--model", "wrn-10-1", "--epochs", "2", "--warmup-epochs", "2"], "warmup_epochs must be below"),
    (["--model", "wrn-10-1", "--epochs", "2", "--milestones", "1"], "milestones go with schedule='step'"),
    (["--model", "wrn-10-1", "--epochs", "4", "--schedule", "step", "--milestones", "3,2"], "increasing"),
    (["--model", "wrn-10-1", "--epochs", "2", "--momentum", "0.5"], "options of optimizer='sgd'"),
    (["--model", "wrn-10-1", "--epochs", "2", "--momentum", "1"], "momentum"),
    (["--model", "wrn-10-1", "--epochs", "2", "--label-smoothing", "1"], "label-smoothing"),
    (["--model", "resnet50", "--epochs", "1"], "resnet50"),
])
def test_bad_training_options_are_one_line_before_any_work(capsys, colour_npz, tmp_path, extra, pattern):
    out = tmp_path / "bad"
    extra = extra if "--epochs" in extra or "give --epochs" in pattern else [*extra, "--epochs", "1"]
    err = one_line(*run_cli(capsys, *train_args(colour_npz, out, *extra))[::2])
    assert pattern in err
    assert not out.exists()


def test_resume_keeps_a_state_and_continues(capsys, colour_npz, tmp_path):
    args = train_args(colour_npz, tmp_path / "r", "--model", "wrn-10-1", "--epochs", "2", "--batch-size", "4",
                      "--resume")
    code, _, err = run_cli(capsys, *args)
    assert code == 0, err
    assert (tmp_path / "r" / "train_state.pt").is_file()
    first = json.loads((tmp_path / "r" / "results.json").read_text())
    code, _, err = run_cli(capsys, *args)  # everything was done: the saved epochs come back unchanged
    assert code == 0, err
    again = json.loads((tmp_path / "r" / "results.json").read_text())
    assert again["history"]["epochs"] == first["history"]["epochs"]
    assert again["test_accuracy"] == first["test_accuracy"]
    code, _, err = run_cli(capsys, *args[:-1], "--lr", "0.01", "--resume")
    assert "other settings" in one_line(code, err)


# ------------------------------------------------------------------------------- fit checks, library
def test_check_input_names_the_model_the_input_and_what_fits():
    spec = models.check_input("wrn-40-2", 3, 32, 10)
    assert spec["options"] == {"depth": 40, "width": 2, "dropout": 0.0} and spec["input_size"] == 32
    with pytest.raises(ConfigError) as exc:
        models.check_input("resnet50", 1, 8)
    msg = str(exc.value)
    assert "resnet50" in msg and "1x8x8" in msg and "digits_cnn" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="no option 'patch'"):
        models.check_input("resnet20", 3, 32, patch=4)
    assert models.options("wrn-16-4") == {"depth": 16, "width": 4, "dropout": 0.0}
    assert set(models.options("densenet_bc")) >= {"depth", "growth"}


def test_a_checkpoint_that_does_not_fit_the_data_is_refused_naming_both(capsys, colour_npz, tmp_path,
                                                                         mlp_digits_checkpoint):
    # a 1-channel 8x8 model on 3-channel 16x16 data, and a 3-class data set on a model of another size
    for verb in (["score", "--metric", "gini"], ["generate", "--method", "pgd"], ["analyze"]):
        err = one_line(*run_cli(capsys, verb[0], "--checkpoint", mlp_digits_checkpoint, "--dataset", "npz",
                                "--data-dir", colour_npz, *verb[1:], "--out", tmp_path / verb[0])[::2])
        assert "1-channel" in err and "3 channels" in err, err
        assert not (tmp_path / verb[0]).exists() or not any((tmp_path / verb[0]).iterdir())


# ----------------------------------------------------------------------------- run / compare recipes
ROBOT_TINY = {"dataset": "digits", "train_limit": 200, "test_limit": 40, "eps": 0.15, "epochs": 2, "batch_size": 64,
              "whitebox_limit": 20, "whitebox_pgd_steps": 2, "whitebox_restarts": 1, "apgd_steps": 2,
              "convergence_probe": 20, "pool_pgd_steps": 3, "verbose": False, "strategy": "random"}


@pytest.mark.parametrize("d, pattern", [
    ({"finetune_options": {"lr": 0.1}}, "finetune_options: unknown option 'lr'"),
    ({"finetune_options": {"milestones": [1]}}, "finetune_options: milestones go with schedule='step'"),
    ({"finetune_options": {"schedule": "step", "milestones": [20]}}, "finetune_options: milestones must be"),
    ({"finetune_options": {"amp": "fp8"}}, "finetune_options: unknown amp 'fp8'"),
    ({"finetune_options": "crop-flip"}, "finetune_options must be a mapping"),
    ({"train_options": {"momentum": 0.5}}, "train_options: momentum and nesterov are options of optimizer='sgd'"),
    ({"train_options": {"batch_size": 0}}, "train_options: batch_size"),
    ({"train_options": {"lr": float("nan")}}, "train_options: lr"),
    ({"train_model": "resnet50"}, "train_model on digits: model 'resnet50' cannot take 1x8x8"),
    ({"train_model": "resnet18", "dataset": "mnist"}, "train_model on mnist: model 'resnet18' cannot take 1x28x28"),
])
def test_robot_config_checks_training_options_and_the_model_size(d, pattern):
    from robustest.robot import RobotConfig

    with pytest.raises(ConfigError) as exc:
        RobotConfig.from_dict({**ROBOT_TINY, **d})
    assert pattern in str(exc.value) and "\n" not in str(exc.value)


def test_run_refuses_a_train_model_that_cannot_take_the_data_before_any_work(capsys, tmp_path):
    out = tmp_path / "run"
    err = one_line(*run_cli(capsys, "run", "--dataset", "digits", "--train-model", "resnet50", "--out", out,
                            "--no-progress")[::2])
    assert "resnet50" in err and "1x8x8" in err and "digits_cnn" in err
    assert not out.exists()
    err = one_line(*run_cli(capsys, "compare", "--dataset", "digits", "--train-model", "wrn-16-4",
                            "--finetune-options", '{"augment": "mixup"}', "--out", out, "--no-progress")[::2])
    assert "finetune_options: unknown augment" in err and not out.exists()


def test_compare_passes_the_recipe_options_to_training(tmp_path, monkeypatch):
    from robustest import robot, train

    calls = []
    real = train.fit

    def spy(model, data, epochs, batch_size, recipe, **kw):
        calls.append({"batch_size": batch_size, **vars(recipe)})
        return real(model, data, epochs, batch_size, recipe, **kw)

    monkeypatch.setattr(train, "fit", spy)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = robot.compare({**ROBOT_TINY, "train_model": "digits_cnn", "train_epochs": 1, "strategies": ["random"],
                             "budgets": ["10%"], "out": str(tmp_path / "c"),
                             "train_options": {"optimizer": "sgd", "lr": 0.05, "batch_size": 32, "momentum": 0.8},
                             "finetune_options": {"schedule": "step", "milestones": [1], "augment": "crop-flip"}})
    finally:
        torch.set_num_threads(threads)
    assert res["table"][0]["n"] > 0
    original, finetune = calls[0], calls[1]
    assert (original["optimizer"], original["lr"], original["batch_size"], original["momentum"]) == \
        ("sgd", 0.05, 32, 0.8)
    assert (finetune["optimizer"], finetune["schedule"], finetune["milestones"], finetune["augment"]) == \
        ("adam", "step", [1], "crop-flip")
    assert finetune["lr"] == ROBOT_TINY.get("lr", 1e-3) and finetune["momentum"] is None  # Adam: SGD's unset
    assert res["config"]["finetune_options"]["augment"] == "crop-flip"


def test_state_fingerprint_of_a_batch_norm_model():
    """Regression: batch norm's 0-d num_batches_tracked made state_fingerprint (and so run/compare with a
    checkpoint of any BN network) fail."""
    from robustest.models import checkpoints

    torch.manual_seed(0)
    a = models.create("resnet20", input_size=8)
    fp = checkpoints.state_fingerprint(a)
    assert fp == checkpoints.state_fingerprint(a) and len(fp) == 64
    a.layer1[0].bn1.num_batches_tracked += 1
    assert checkpoints.state_fingerprint(a) != fp
