"""The command line: info, train, --help of every verb, one-line errors with exit code 2."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_runner import run_cli
from robustest import cli, data, models
from robustest import evaluate as ev
from robustest.core.errors import EXIT_INTERNAL, DataError
from robustest.models.checkpoints import load_checkpoint

pytestmark = pytest.mark.usefixtures("no_data_env")


def assert_one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def verbs() -> list[str]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sorted(sub.choices)


def write_tiny_mnist(folder: Path, gz: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 20), ("t10k", 10)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = (np.arange(n) % 10).astype(np.uint8)
        files = {f"{prefix}-images-idx3-ubyte": struct.pack(">IIII", 2051, n, 28, 28) + x.tobytes(),
                 f"{prefix}-labels-idx1-ubyte": struct.pack(">II", 2049, n) + y.tobytes()}
        for name, raw in files.items():
            if gz:
                (folder / (name + ".gz")).write_bytes(gzip.compress(raw))
            else:
                (folder / name).write_bytes(raw)


# ------------------------------------------------------------------------------------------- info, help
def test_info_lists_data_sets_and_models(capsys):
    code, out, err = run_cli(capsys, "info")
    assert code == 0 and err == ""
    assert out.startswith("robustest ")
    assert "data sets:" in out and "models:" in out
    for name in data.names() + models.names():
        assert f"  {name}" in out
    assert "LeNet-5" in out  # descriptions shown


def test_every_verb_has_help(capsys):
    names = verbs()
    assert {"info", "train"} <= set(names)
    for verb in names:
        code, out, _ = run_cli(capsys, verb, "--help")
        assert code == 0, verb
        assert f"robustest {verb}" in out and "--help" in out


def test_top_level_help_version_and_no_verb(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and "train" in out and "info" in out
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.strip() == f"robustest {__import__('robustest').__version__}"
    code, _, err = run_cli(capsys)
    assert code == 2 and "usage" in err
    code, _, err = run_cli(capsys, "frobnicate")
    assert_one_line_error(code, err)


# -------------------------------------------------------------------------------------------------- train
def test_train_on_digits_writes_checkpoint_and_report(tmp_path, capsys, results_contract):
    out_dir = tmp_path / "run"
    code, out, err = run_cli(capsys, "train", "--dataset", "digits", "--model", "digits_cnn", "--epochs", "1",
                             "--batch-size", "32", "--lr", "3e-3", "--seed", "1", "--out", out_dir, "--no-progress")
    assert code == 0, err
    assert "test accuracy" in out and "model.pt" in out
    assert "1437 images, 1 epoch, " in out  # not "1 epochs"
    assert sorted(os.listdir(out_dir)) == ["model.pt", "report.html", "results.json"]
    rep = results_contract(out_dir, "train")
    assert set(rep["settings"]) == {"dataset", "model", "epochs", "batch_size", "lr", "optimizer", "weight_decay",
                                    "decay_norm_bias", "warmup_epochs", "label_smoothing", "compile", "normalize",
                                    "seed", "device"}  # no --split, --limit, schedule, momentum: not in effect
    assert rep["num_train"] == 1437 and rep["num_test"] == 360
    assert len(rep["history"]["epochs"]) == 1 and rep["settings"]["seed"] == 1
    assert rep["settings"]["lr"] == 3e-3 and rep["settings"]["batch_size"] == 32 and "out" not in rep["settings"]
    assert rep["model"]["name"] == "digits_cnn" and rep["model"]["input_size"] == 8 and rep["model"]["mean"]
    assert set(rep["timings"]) >= {"load_data_s", "train_s", "eval_s", "total_s"} and rep["peak_rss_mib"] > 0
    assert 0.7 <= rep["test_accuracy"] <= 1.0
    model = load_checkpoint(out_dir / "model.pt")
    assert model.robustest_metadata["dataset"] == "digits"
    assert ev.accuracy(model, data.load("digits", split="test")) == pytest.approx(rep["test_accuracy"])
    torch.load(out_dir / "model.pt", weights_only=True)


def test_train_on_idx_folder_with_limit(tmp_path, capsys):
    write_tiny_mnist(tmp_path / "mnist" / "raw", gz=True)
    code, out, err = run_cli(capsys, "train", "--dataset", "mnist", "--data-dir", tmp_path / "mnist", "--model",
                             "lenet1", "--epochs", "1", "--limit", "12", "--out", tmp_path / "o", "--no-progress")
    assert code == 0, err
    rep = json.loads((tmp_path / "o" / "results.json").read_text())
    assert rep["num_train"] == 12 and rep["num_test"] == 10 and rep["model"]["input_size"] == 28


# ------------------------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("args, pattern", [
    (["--dataset", "mnist", "--data-dir", "{tmp}/does-not-exist", "--model", "lenet5"], "does not exist"),
    (["--dataset", "mnist", "--model", "lenet5"], "ROBUSTEST_DATA"),
    (["--dataset", "imagenet", "--model", "lenet5"], "unknown data set"),
    (["--dataset", "digits", "--model", "resnet1000"], "unknown model 'resnet1000'"),
    (["--dataset", "digits", "--model", "lenet5"], "cannot take 1x8x8"),
    (["--dataset", "digits", "--model", "digits_cnn", "--device", "warp-drive"], "unknown device"),
    (["--dataset", "digits", "--model", "digits_cnn", "--lr", "-1"], "learning rate in (0, 10]"),
    (["--dataset", "digits", "--model", "digits_cnn", "--batch-size", "0"], "positive"),
    (["--dataset", "digits", "--model", "digits_cnn", "--limit", "x"], "positive integer"),
])
def test_train_bad_arguments(tmp_path, capsys, args, pattern):
    argv = ["train", *[a.format(tmp=tmp_path) for a in args], "--out", tmp_path / "out"]
    if "--epochs" not in args:
        argv += ["--epochs", "1"]
    code, out, err = run_cli(capsys, *argv)
    line = assert_one_line_error(code, err)
    assert pattern in line
    assert not (tmp_path / "out").exists()  # regression: bad input used to leave an empty --out folder


@pytest.mark.parametrize("epochs", ["-1", "0", "two"])
def test_train_bad_epochs(tmp_path, capsys, epochs):
    code, _, err = run_cli(capsys, "train", "--dataset", "digits", "--model", "digits_cnn", "--epochs", epochs,
                           "--out", tmp_path)
    assert "--epochs" in assert_one_line_error(code, err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_train_cuda_without_cuda(tmp_path, capsys):
    code, _, err = run_cli(capsys, "train", "--dataset", "digits", "--model", "digits_cnn", "--epochs", "1",
                           "--device", "cuda", "--out", tmp_path / "o")
    assert "CUDA is not available" in assert_one_line_error(code, err)


@pytest.mark.parametrize("gz", [False, True])
def test_train_truncated_idx(tmp_path, capsys, gz):
    write_tiny_mnist(tmp_path, gz=gz)
    p = tmp_path / ("train-images-idx3-ubyte" + (".gz" if gz else ""))
    p.write_bytes(p.read_bytes()[:-100])
    code, _, err = run_cli(capsys, "train", "--dataset", "mnist", "--data-dir", tmp_path, "--model", "lenet5",
                           "--epochs", "1", "--out", tmp_path / "o")
    line = assert_one_line_error(code, err)
    assert "truncated" in line and "train-images-idx3-ubyte" in line


def test_train_out_is_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    code, _, err = run_cli(capsys, "train", "--dataset", "digits", "--model", "digits_cnn", "--epochs", "1",
                           "--out", tmp_path / "f")
    assert "not a folder" in assert_one_line_error(code, err)


def test_debug_flag_shows_the_exception(tmp_path, capsys):
    with pytest.raises(DataError):
        cli.main(["--debug", "train", "--dataset", "imagenet", "--model", "lenet5", "--epochs", "1",
                  "--out", str(tmp_path)])


def test_internal_errors_are_one_line_exit_3(tmp_path, capsys, monkeypatch):
    from robustest.cli import train as train_verb

    def boom(*a, **k):
        raise ZeroDivisionError("unexpected\nsecond line")

    monkeypatch.setattr(train_verb, "load_data", boom)
    code, _, err = run_cli(capsys, "train", "--dataset", "digits", "--model", "digits_cnn", "--epochs", "1",
                           "--out", tmp_path)
    assert code == EXIT_INTERNAL == 3 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "internal error" in err and "--debug" in err


@pytest.mark.parametrize("exc, expected", [
    (FileNotFoundError(2, "No such file or directory", "/x/y.pt"), "No such file or directory: /x/y.pt"),
    (FileNotFoundError(2, "No such file or directory"), "No such file or directory"),
    (PermissionError("not allowed"), "not allowed"),
])
def test_os_errors_are_one_line_exit_2(tmp_path, capsys, monkeypatch, exc, expected):
    """Regression: an OSError without a file name was printed as '...: None'."""
    from robustest.cli import train as train_verb

    def fail(*a, **k):
        raise exc

    monkeypatch.setattr(train_verb, "load_data", fail)
    code, _, err = run_cli(capsys, "train", "--dataset", "digits", "--model", "digits_cnn", "--epochs", "1",
                           "--out", tmp_path)
    line = assert_one_line_error(code, err)
    assert line == f"robustest train: error: {expected}"


def test_missing_required_arguments(capsys):
    code, _, err = run_cli(capsys, "train")
    line = assert_one_line_error(code, err)
    assert "required" in line and "--dataset" in line and "--help" in line


# ------------------------------------------------------------------------------- unsafe checkpoints
@pytest.fixture
def whole_model_file(tmp_path) -> Path:
    p = tmp_path / "whole.pt"
    torch.save(models.create("digits_cnn", input_size=8), p)
    return p


def test_load_model_refuses_whole_pickled_model(whole_model_file, capsys):
    import argparse

    from robustest.cli.loading import load_model
    from robustest.core.errors import CheckpointError

    args = argparse.Namespace(checkpoint=str(whole_model_file), device=None, torchscript=False)
    with pytest.raises(CheckpointError, match="pickled Python objects"):
        load_model(args)


def test_verb_with_checkpoint_refuses_whole_pickled_model(whole_model_file, tmp_path, capsys):
    """Any verb taking --checkpoint: a whole pickled model is a one-line error with exit code 2."""
    if "score" not in verbs():
        pytest.skip("no verb taking --checkpoint yet")
    code, _, err = run_cli(capsys, "score", "--checkpoint", whole_model_file, "--dataset", "digits",
                           "--metric", "gini", "--out", tmp_path / "o")
    assert "pickled Python objects" in assert_one_line_error(code, err)


# ---------------------------------------------------------------------------- the CLI's shared helpers
def test_common_helpers(tmp_path, capsys):
    import argparse

    from robustest.cli import args as cli_args
    from robustest.cli import loading as cli_loading
    from robustest.cli import output as cli_output
    from robustest.core.errors import ConfigError

    assert cli_args.positive_int("3") == 3 and cli_args.positive_float("0.5") == 0.5
    for fn, bad in ((cli_args.positive_int, "0"), (cli_args.positive_int, "1.5"), (cli_args.positive_float, "-2"),
                    (cli_args.positive_float, "nan"), (cli_args.positive_float, "x")):
        with pytest.raises(argparse.ArgumentTypeError):
            fn(bad)
    from robustest.cli import build_parser

    args = build_parser().parse_args(["corrupt", "--dataset", "digits", "--limit", "50", "--out", "o"])
    ds = cli_loading.load_data(args)
    assert len(ds) == 50 and len(cli_loading.load_data(args, "train")) == 50
    model = models.create("digits_cnn", num_classes=10, in_channels=1, input_size=8)
    cli_loading.check_fits(model, ds)
    with pytest.raises(ConfigError, match="8x8"):
        cli_loading.check_fits(models.create("lenet5"), ds)
    with pytest.raises(ConfigError, match="3-channel"):
        cli_loading.check_fits(models.create("resnet20", in_channels=3, input_size=32), ds)
    with pytest.raises(ConfigError, match="5 classes"):
        cli_loading.check_fits(models.create("digits_cnn", num_classes=5, input_size=8), ds)
    with pytest.raises(ConfigError, match="cannot take the data's 1x8x8 images"):  # no spec: probed
        cli_loading.check_fits(torch.nn.Linear(2, 2), ds)
    assert cli_loading.check_fits(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)), ds) == 10
    out = cli_output.out_dir(argparse.Namespace(out=str(tmp_path / "a" / "b")))
    assert out.is_dir()
    restore = cli_output.configure_logging("test")  # what the command does: report lines go to stdout
    try:
        cli_output.print_table([{"name": "x", "acc": 0.5}, {"name": "long-name", "acc": None}], ["name", "acc"])
    finally:
        restore()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "acc"] and set(lines[1].replace(" ", "")) == {"-"}
    assert lines[2].split() == ["x", "0.500"] and lines[3].split() == ["long-name", "-"]  # accuracy: 3 decimals
    assert lines[0].index("acc") == lines[2].index("0.500") == lines[3].rindex("-")  # aligned columns


# ------------------------------------------------------------------------------------- console script
def console_script() -> list[str]:
    exe = shutil.which("robustest") or str(Path(sys.executable).parent / "robustest")
    return [exe] if Path(exe).exists() else [sys.executable, "-m", "robustest"]


def test_console_script_errors_in_a_subprocess(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ROBUSTEST_DATA"}
    proc = subprocess.run([*console_script(), "train", "--dataset", "mnist", "--data-dir", str(tmp_path / "nope"),
                           "--model", "lenet5", "--epochs", "1", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    line = assert_one_line_error(proc.returncode, proc.stderr)
    assert line.startswith("robustest train: error:") and "does not exist" in line


# -------------------------------------------------------------------------------------------- slow e2e
# These run with the session's one intra-op thread (conftest): about 15 s and 35 s of CPU on this machine; two
# threads gain little here and cost many times more when other processes share the cores.
@pytest.mark.slow
def test_train_digits_cnn_reaches_95_percent(tmp_path, capsys):
    code, out, err = run_cli(capsys, "train", "--dataset", "digits", "--model", "digits_cnn", "--epochs", "30",
                             "--out", tmp_path, "--no-progress")
    assert code == 0, err
    rep = json.loads((tmp_path / "results.json").read_text())
    assert rep["test_accuracy"] >= 0.95, rep["test_accuracy"]


@pytest.mark.slow
def test_train_lenet5_on_real_mnist_reaches_98_5_percent(tmp_path, capsys, mnist_root):
    code, out, err = run_cli(capsys, "train", "--dataset", "mnist", "--data-dir", mnist_root, "--model", "lenet5",
                             "--epochs", "3", "--out", tmp_path, "--no-progress")
    assert code == 0, err
    rep = json.loads((tmp_path / "results.json").read_text())
    assert rep["num_train"] == 60000 and rep["num_test"] == 10000
    assert rep["test_accuracy"] >= 0.985, rep["test_accuracy"]


def test_train_says_when_the_data_has_no_separate_test_split(capsys, tmp_path):
    # regression: an npz without per-split arrays serves the same images as train and test split, and the
    # reported "test accuracy" was silently measured on the training data
    import numpy as np

    rng = np.random.default_rng(0)
    path = tmp_path / "one.npz"
    np.savez(path, x=rng.integers(0, 256, (40, 8, 8), dtype=np.uint8), y=np.arange(40) % 2)
    code, _, err = run_cli(capsys, "train", "--dataset", "npz", "--data-dir", str(path), "--model", "mlp",
                           "--epochs", "1", "--out", str(tmp_path / "out"), "--no-progress")
    assert code == 0
    assert "no separate test split" in err
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report["test_split_is_training_data"] is True


def test_output_into_a_closed_pipe_is_quiet() -> None:
    # regression: `robustest info | head -1` printed one logging traceback per remaining line
    proc = subprocess.run(f"{sys.executable} -m robustest info | head -1", shell=True, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.startswith("robustest ") and proc.stderr == ""


def test_every_verb_takes_threads(capsys) -> None:
    import torch

    from robustest.cli import main

    before = torch.get_num_threads()
    try:
        assert main(["info", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    from robustest.cli import build_parser

    verbs = build_parser()._subparsers._group_actions[0].choices
    assert all("--threads" in sp._option_string_actions for sp in verbs.values())


def test_the_list_hint_comes_only_with_a_stray_value(tmp_path, capsys) -> None:
    """'list options take one comma-separated value' is said when a value was left over (a list written with
    spaces), not for an unknown option."""
    from robustest.cli import main

    base = ["corrupt", "--dataset", "digits", "--limit", "4", "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as info:
        main([*base, "--severities", "1", "3"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "unrecognized arguments: 3" in err and "comma-separated value" in err
    with pytest.raises(SystemExit) as info:
        main([*base, "--no-such-flag"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "unrecognized arguments: --no-such-flag" in err
    assert "comma-separated" not in err and err.count("\n") == 1


def test_load_checked_loads_the_model_and_split_and_refuses_a_misfit(mlp_digits_checkpoint, tmp_path):
    import argparse

    from robustest.cli import build_parser
    from robustest.cli.loading import load_checked
    from robustest.core.errors import ConfigError

    args = build_parser().parse_args(["eval", "--checkpoint", str(mlp_digits_checkpoint), "--dataset", "digits",
                                      "--limit", "30", "--eps", "0.1", "--out", str(tmp_path / "o")])
    model, ds = load_checked(args)
    assert len(ds) == 30 and ds[0][0].shape == (1, 8, 8) and next(model.parameters()).device.type == "cpu"
    _, train = load_checked(args, "train")
    assert torch.equal(train[0][0], load_checked(argparse.Namespace(**{**vars(args), "split": "train"}))[1][0][0])
    misfit = tmp_path / "five.pt"
    from robustest.models.checkpoints import save_checkpoint

    save_checkpoint(misfit, models.create("mlp", num_classes=5, in_channels=1, input_size=8))
    with pytest.raises(ConfigError, match="5 classes"):
        load_checked(argparse.Namespace(**{**vars(args), "checkpoint": str(misfit)}))
