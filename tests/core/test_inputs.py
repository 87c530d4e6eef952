"""Sizes refused from headers, before anything is decoded or parsed: images larger than a model is run on (npz,
npy and IDX headers), and config files larger than a config may be."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from robustest import cli, data
from robustest.core.errors import DataError
from robustest.data import formats

TOO_LARGE = ("the images are 1x4000x4000 (16,000,000 values each), more than the 3,145,728 (3 x 1024 x 1024) a model "
             "is run on")


def npy_header(shape: tuple[int, ...], descr: str = "|u1") -> bytes:
    """A .npy header declaring ``shape`` and no data after it (what a forged or truncated file starts with)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


@pytest.fixture
def never_read(monkeypatch):
    """Fail the test if any array data is read or loaded."""

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("array data was read before the header's shape was checked")

    monkeypatch.setattr(formats, "_read_array", fail)
    monkeypatch.setattr(np, "load", fail)
    monkeypatch.setattr(np, "memmap", fail)


def forged_npz(path: Path, n: int = 50) -> Path:
    """A Keras-style npz whose x_train header declares n 4000 x 4000 images (it holds none)."""
    with zipfile.ZipFile(path, "w") as zf:
        for split in ("train", "test"):
            zf.writestr(f"x_{split}.npy", npy_header((n, 4000, 4000)))
            zf.writestr(f"y_{split}.npy", npy_bytes(np.zeros(n, dtype=np.int64)))
    return path


def test_npz_images_too_large_are_refused_from_the_header(tmp_path, never_read):
    path = forged_npz(tmp_path / "big.npz")
    with pytest.raises(DataError, match=TOO_LARGE.replace("(", r"\(").replace(")", r"\)")):
        data.load("npz", root=path, split="train")


def test_npy_images_too_large_are_refused_from_the_header(tmp_path, never_read):
    (tmp_path / "x.npy").write_bytes(npy_header((50, 4000, 4000, 1)))
    with pytest.raises(DataError, match=r"the images are 1x4000x4000 \(16,000,000 values each\)"):
        formats.open_npy(tmp_path / "x.npy")


def test_idx_images_too_large_are_refused_from_the_header(tmp_path, never_read):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(b"\x00\x00\x08\x03" + struct.pack(">3I", 50, 4000, 4000))  # the header alone
    with pytest.raises(DataError, match=r"the images are 1x4000x4000 \(16,000,000 values each\)"):
        formats.read_idx(path, 3)


def test_images_within_the_bound_still_load(tmp_path):
    x = np.zeros((3, 1, 1024, 1024), dtype=np.uint8)
    np.savez(tmp_path / "ok.npz", x=x, y=np.zeros(3, dtype=np.int64))
    assert data.load("npz", root=tmp_path / "ok.npz").tensors[0].shape == (3, 1, 1024, 1024)


def test_train_refuses_a_set_of_huge_images_from_its_header(tmp_path, capsys, never_read):
    path = forged_npz(tmp_path / "big.npz")
    code = cli.main(["train", "--dataset", "npz", "--data-dir", str(path), "--model", "digits_cnn", "--epochs", "1",
                     "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.strip() == f"robustest train: error: npz big.npz: {TOO_LARGE}: resize them to the size the model was " \
                          "built for"


def test_a_zoo_model_is_never_probed_with_images_no_model_is_run_on():
    from robustest import models
    from robustest.core.errors import ConfigError

    with pytest.raises(ConfigError, match="the images are 1x4000x4000"):
        models.check_input("digits_cnn", 1, 4000, 10)


def test_a_config_file_over_the_limit_is_refused_before_parsing(tmp_path, capsys, monkeypatch):
    import yaml

    from robustest.robot.config import MAX_CONFIG_BYTES

    cfg = tmp_path / "run.yaml"
    cfg.write_text("".join(f"k{i}: {i}\n" for i in range(MAX_CONFIG_BYTES // 8)))
    size = cfg.stat().st_size
    assert size > MAX_CONFIG_BYTES

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the config was parsed before its size was checked")

    monkeypatch.setattr(yaml, "safe_load", fail)
    code = cli.main(["run", "--config", str(cfg), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert err.strip() == (f"robustest run: error: config file {cfg} is {size:,} bytes, more than the "
                           f"{MAX_CONFIG_BYTES:,} a config may have: a run config holds a few keys (see "
                           "docs/RESULTS_SCHEMA.md)")


def test_a_config_that_is_not_a_mapping_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("- rounds\n- 3\n")
    code = cli.main(["run", "--config", str(cfg), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == (f"robustest run: error: config file {cfg} holds a list, not a mapping of "
                                         "keys: write one key: value per line")


def test_one_size_check_at_the_bound_with_its_source_and_error_class():
    from robustest.core.errors import ConfigError
    from robustest.core.inputs import check_image_size

    check_image_size((3, 1024, 1024))  # exactly the limit
    with pytest.raises(ConfigError, match=r"^the images are 1x3145729x1 \(3,145,729 values each\), more than the "
                                          r"3,145,728 \(3 x 1024 x 1024\) a model is run on: resize them \(image "
                                          r"folders: --resize H W\) to the size the model was built for$"):
        check_image_size((1, 3 * 1024 * 1024 + 1, 1))
    with pytest.raises(DataError, match=r"^f\.pt: the suite's images are 2x2048x1024 \(4,194,304 values each\), "
                                        r"more than the 3,145,728 \(3 x 1024 x 1024\) a model is run on: smaller$"):
        check_image_size((2, 2048, 1024), source="f.pt", what="the suite's images", fix="smaller", error=DataError)
