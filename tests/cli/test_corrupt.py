"""Tests of the ``robustest corrupt`` verb (on the built-in digits data set)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from robustest import corruptions as C
from robustest import data
from robustest.cli import main


def test_severities_flag_takes_ranges_and_lists_sorted(capsys) -> None:
    from robustest.cli import build_parser

    parser = build_parser()

    def sev(text: str) -> list[int]:
        return parser.parse_args(["corrupt", "--dataset", "digits", "--out", "o", "--severities", text]).severities

    assert sev("1-5") == [1, 2, 3, 4, 5] and sev("3") == [3] and sev("5,1,3") == [1, 3, 5] and sev("1-2,4") == [1, 2, 4]
    for bad in ("0", "6", "5-1", "a", "1-6", ""):
        with pytest.raises(SystemExit):
            sev(bad)
        assert "--severities" in capsys.readouterr().err


def test_corrupt_all_on_digits(tmp_path: Path, capsys: pytest.CaptureFixture[str], results_contract) -> None:
    out = tmp_path / "digits-c"
    rc = main(["corrupt", "--dataset", "digits", "--corruptions", "all", "--severities", "1-5", "--limit", "24",
               "--batch-size", "10", "--out", str(out), "--no-progress", "--seed", "4"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "19 corruption file(s) x" in printed and "wrote results.json, report.html, " in printed
    assert "15 more to " in printed  # 21 files: the first six named, the rest counted
    res = results_contract(out, "corrupt")
    assert res["num_images"] == 24 and res["settings"]["seed"] == 4 and res["settings"]["batch_size"] == 10
    assert set(res["timings"]) == {"load_s", "total_s"} | {f"{name}_s" for name in C.names()}
    assert res["settings"]["severities"] == [1, 2, 3, 4, 5] and res["settings"]["table"] == "cifar"
    assert sorted(res["corruptions"]) == sorted(C.names()) == sorted(res["settings"]["corruptions"])
    assert (out / "report.html").stat().st_size > 1000 and not (out / "manifest.json").exists()
    clean = data.load("digits", split="test")
    x0, y0 = clean.tensors[0][:24], clean.tensors[1][:24]
    for name in C.names():
        with np.load(out / f"{name}.npz") as f:
            assert f["x_test"].dtype == np.uint8 and f["x_test"].shape == (120, 8, 8)
            assert f["y_test"].dtype == np.uint8 and np.array_equal(f["y_test"], np.tile(y0.numpy(), 5))
            assert np.array_equal(f["severity"], np.repeat(np.arange(1, 6), 24))
            assert np.array_equal(f["index"], np.tile(np.arange(24), 5))
        ds = data.load("npz", out / f"{name}.npz", split="test")
        x, y = ds.tensors
        assert x.shape == (120, 1, 8, 8) and torch.equal(y, torch.tile(y0, (5,)))
    # the stored rows are corrupt() of each batch with seed + batch start, rounded to uint8
    ds = data.load("npz", out / "gaussian_noise.npz", split="test")
    sev3 = ds.tensors[0][48:72]
    want = torch.cat([C.corrupt(x0[s:s + 10], "gaussian_noise", 3, seed=4 + s) for s in range(0, 24, 10)])
    assert torch.equal(sev3, torch.round(want * 255) / 255)


def test_corrupt_is_deterministic_and_train_split(tmp_path: Path) -> None:
    args = ["corrupt", "--dataset", "digits", "--split", "train", "--corruptions", "noise,glass_blur",
            "--severities", "2,4", "--limit", "16", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    ma = json.loads((tmp_path / "a" / "results.json").read_text())
    mb = json.loads((tmp_path / "b" / "results.json").read_text())
    assert list(ma["corruptions"]) == ["gaussian_noise", "shot_noise", "impulse_noise", "glass_blur"]
    for name in ma["corruptions"]:
        assert ma["corruptions"][name]["sha256"] == mb["corruptions"][name]["sha256"]
    ds = data.load("npz", tmp_path / "a" / "glass_blur.npz", split="train")
    assert ds.tensors[0].shape == (32, 1, 8, 8)
    with pytest.raises(Exception, match="x_test"):
        data.load("npz", tmp_path / "a" / "glass_blur.npz", split="test")
    assert main([*args, "--seed", "1", "--out", str(tmp_path / "c")]) == 0
    mc = json.loads((tmp_path / "c" / "results.json").read_text())
    assert mc["corruptions"]["gaussian_noise"]["sha256"] != ma["corruptions"]["gaussian_noise"]["sha256"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--corruptions", "rain"], "unknown corruption 'rain'"),
        (["--severities", "0-3"], "severity 0 is outside 1-5"),
        (["--severities", "3-1"], "range '3-1' is empty"),
        (["--severities", "high"], "is not a number or a range"),
        (["--severities", "1,,3"], "empty item"),
        (["--corruptions", "fog", "blur"], "comma-separated"),
        (["--table", "svhn"], "invalid choice"),
        (["--batch-size", "0"], "positive integer"),
    ],
)
def test_corrupt_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
                               message: str) -> None:
    argv = ["corrupt", "--dataset", "digits", "--limit", "4", "--no-progress", "--out", str(tmp_path / "o"), *extra]
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse errors exit directly
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_corrupt_missing_data(tmp_path: Path, capsys: pytest.CaptureFixture[str], no_data_env: None) -> None:
    rc = main(["corrupt", "--dataset", "mnist", "--data-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"),
               "--no-progress"])
    assert rc == 2
    assert "does not exist" in capsys.readouterr().err


def test_corrupt_out_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    rc = main(["corrupt", "--dataset", "digits", "--corruptions", "fog", "--limit", "2", "--out", str(f),
               "--no-progress"])
    assert rc == 2 and "not a folder" in capsys.readouterr().err
