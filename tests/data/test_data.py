"""Data loaders: every format on small files written here, error paths, real MNIST."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from robustest import data
from robustest.core.errors import DataError

pytestmark = pytest.mark.usefixtures("no_data_env")


# ----------------------------------------------------------------------------------------------- helpers
def idx_bytes(arr: np.ndarray) -> bytes:
    """IDX encoding of a uint8 array (magic 0x0000 08 ndim, big-endian dims, data)."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    return struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def fake_mnist(n: int, seed: int, size: int = 28) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, size, size), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


MNIST_FILES = {
    "orig": {("train", "x"): "train-images-idx3-ubyte", ("train", "y"): "train-labels-idx1-ubyte",
             ("test", "x"): "t10k-images-idx3-ubyte", ("test", "y"): "t10k-labels-idx1-ubyte"},
    "dotted": {("train", "x"): "train-images.idx3-ubyte", ("train", "y"): "train-labels.idx1-ubyte",
               ("test", "x"): "t10k-images.idx3-ubyte", ("test", "y"): "t10k-labels.idx1-ubyte"},
}


def write_mnist_idx(folder: Path, style: str = "orig", gz: bool = False, n_train: int = 7, n_test: int = 5
                    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Write the four IDX files of a tiny MNIST look-alike into ``folder``; return the arrays per split."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, n, seed in (("train", n_train, 1), ("test", n_test, 2)):
        x, y = fake_mnist(n, seed)
        out[split] = (x, y)
        for kind, arr in (("x", x), ("y", y)):
            name = MNIST_FILES[style][(split, kind)]
            raw = idx_bytes(arr)
            if gz:
                (folder / (name + ".gz")).write_bytes(gzip.compress(raw))
            else:
                (folder / name).write_bytes(raw)
    return out


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def assert_contract(ds: TensorDataset, n: int, shape: tuple[int, int, int]) -> None:
    x, y = ds.tensors
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert tuple(x.shape) == (n, *shape) and tuple(y.shape) == (n,)
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0


def assert_one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert msg and "\n" not in msg
    return msg


# ----------------------------------------------------------------------------------------------- digits
def test_digits_shapes_range_and_sizes():
    tr, te = data.load("digits", split="train"), data.load("digits", split="test")
    assert_contract(tr, 1437, (1, 8, 8))
    assert_contract(te, 360, (1, 8, 8))
    assert float(tr.tensors[0].max()) == 1.0  # rescaled from 0..16
    assert sorted(set(tr.tensors[1].tolist())) == list(range(10))


def test_digits_split_is_fixed_stratified_and_disjoint():
    from sklearn.datasets import load_digits

    tr, te = data.load("digits", split="train"), data.load("digits", split="test")
    tr2 = data.load("digits", split="train")
    assert torch.equal(tr.tensors[0], tr2.tensors[0]) and torch.equal(tr.tensors[1], tr2.tensors[1])
    # stratified: class proportions in the test split follow the whole set within one sample
    counts_all = np.bincount(load_digits().target, minlength=10)
    counts_te = np.bincount(te.tensors[1].numpy(), minlength=10)
    assert np.all(np.abs(counts_te - counts_all * 360 / 1797) <= 1.0)
    # the union of both splits is exactly the data set (no duplicates across splits)
    all_imgs = {row.tobytes() + bytes([lab]) for row, lab in zip(
        (load_digits().images / 16.0).astype(np.float32), load_digits().target)}
    got = [img.numpy().tobytes() + bytes([int(lab)]) for ds in (tr, te) for img, lab in
           zip(ds.tensors[0][:, 0], ds.tensors[1])]
    assert len(got) == 1797 and set(got) == all_imgs


def test_names_and_info():
    names = data.names()
    for key in ("digits", "mnist", "fashion-mnist", "cifar10", "npz", "folder", "tests"):
        assert key in names
    assert data.info("digits").shape == (1, 8, 8)
    assert data.info("FMNIST").name == "fashion-mnist"  # aliases and case
    with pytest.raises(DataError):
        data.info("imagenet")


def test_unknown_name_and_split():
    with pytest.raises(DataError, match="unknown data set 'imagenet'") as exc:
        data.load("imagenet")
    assert "mnist" in assert_one_line(exc)  # lists the choices
    with pytest.raises(DataError, match="unknown split"):
        data.load("digits", split="val")


def test_num_classes_of():
    assert data.num_classes_of(data.load("digits", split="test")) == 10


# --------------------------------------------------------------------------------------- MNIST IDX files
@pytest.mark.parametrize("style", ["orig", "dotted"])
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("sub", ["", "raw", "MNIST/raw"])
def test_mnist_idx_layouts(tmp_path, style, gz, sub):
    arrays = write_mnist_idx(tmp_path / sub if sub else tmp_path, style=style, gz=gz)
    before = listing(tmp_path)
    for split, n in (("train", 7), ("test", 5)):
        ds = data.load("mnist", root=tmp_path, split=split)
        assert_contract(ds, n, (1, 28, 28))
        x, y = arrays[split]
        np.testing.assert_allclose(ds.tensors[0][:, 0].numpy(), x.astype(np.float32) / 255.0, rtol=0, atol=1e-7)
        assert ds.tensors[1].tolist() == y.tolist()
    assert listing(tmp_path) == before  # loaders write nothing


def test_fashion_mnist_idx_and_npz(tmp_path):
    write_mnist_idx(tmp_path / "FashionMNIST" / "raw", gz=True)
    ds = data.load("fashion-mnist", root=tmp_path, split="test")
    assert_contract(ds, 5, (1, 28, 28))
    x, y = fake_mnist(4, 3)
    f = tmp_path / "other" / "fashion-mnist.npz"
    f.parent.mkdir()
    np.savez(f, x_train=x, y_train=y, x_test=x[:2], y_test=y[:2])
    assert_contract(data.load("fashion_mnist", root=f.parent, split="train"), 4, (1, 28, 28))
    assert_contract(data.load("fashion", root=f, split="test"), 2, (1, 28, 28))


def test_read_idx_other_dtype(tmp_path):
    arr = np.arange(6, dtype=">i4").reshape(2, 3)
    p = tmp_path / "a.idx"
    p.write_bytes(struct.pack(">HBB", 0, 0x0C, 2) + struct.pack(">2I", 2, 3) + arr.tobytes())
    np.testing.assert_array_equal(data.read_idx(p), arr)
    with pytest.raises(DataError, match="dimensions"):
        data.read_idx(p, expected_ndim=3)


# ------------------------------------------------------------------------------------------ Keras npz
def test_keras_npz_file_and_folder(tmp_path):
    x, y = fake_mnist(6, 4)
    f = tmp_path / "mnist.npz"
    np.savez_compressed(f, x_train=x, y_train=y, x_test=x[:3], y_test=y[:3])
    before = listing(tmp_path)
    by_file = data.load("mnist", root=f, split="train")
    by_folder = data.load("mnist", root=tmp_path, split="train")
    assert_contract(by_file, 6, (1, 28, 28))
    assert torch.equal(by_file.tensors[0], by_folder.tensors[0])
    assert by_file.tensors[1].tolist() == y.tolist()
    assert_contract(data.load("mnist", root=str(f), split="test"), 3, (1, 28, 28))
    assert listing(tmp_path) == before


def test_keras_npz_missing_split_keys(tmp_path):
    x, y = fake_mnist(3, 5)
    f = tmp_path / "mnist.npz"
    np.savez(f, x_train=x, y_train=y)
    with pytest.raises(DataError, match="x_test") as exc:
        data.load("mnist", root=f, split="test")
    assert_one_line(exc)


def test_env_var_used_when_root_is_none(tmp_path, monkeypatch):
    write_mnist_idx(tmp_path / "raw")
    monkeypatch.setenv("ROBUSTEST_DATA", str(tmp_path))
    assert len(data.load("mnist", split="train")) == 7
    # an explicit root wins over the environment
    other = tmp_path / "other"
    write_mnist_idx(other, n_train=3)
    assert len(data.load("mnist", root=other, split="train")) == 3


def test_root_needed(tmp_path):
    with pytest.raises(DataError, match="ROBUSTEST_DATA") as exc:
        data.load("mnist", root=None)
    assert_one_line(exc)


# ------------------------------------------------------------------------------------------- CIFAR-10
def cifar_batch(n: int, seed: int, labels_key: bytes = b"labels") -> dict:
    rng = np.random.default_rng(seed)
    return {b"batch_label": b"batch", labels_key: rng.integers(0, 10, n).tolist(),
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [b"f%d.png" % i for i in range(n)]}


def write_cifar(folder: Path, protocol: int) -> dict[str, dict]:
    folder.mkdir(parents=True, exist_ok=True)
    batches = {}
    for i in range(1, 6):
        batches[f"data_batch_{i}"] = cifar_batch(2, i)
    batches["test_batch"] = cifar_batch(3, 9)
    for name, b in batches.items():
        (folder / name).write_bytes(pickle.dumps(b, protocol=protocol))
    return batches


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_cifar10_python_batches(tmp_path, protocol):
    batches = write_cifar(tmp_path / "cifar-10-batches-py", protocol)
    before = listing(tmp_path)
    tr = data.load("cifar10", root=tmp_path, split="train")
    te = data.load("cifar-10", root=tmp_path / "cifar-10-batches-py", split="test")
    assert_contract(tr, 10, (3, 32, 32))
    assert_contract(te, 3, (3, 32, 32))
    b1 = batches["data_batch_1"]
    np.testing.assert_allclose(tr.tensors[0][:2].numpy(), b1[b"data"].reshape(2, 3, 32, 32) / 255.0, atol=1e-7)
    assert tr.tensors[1][:2].tolist() == b1[b"labels"]
    assert listing(tmp_path) == before


def test_cifar_batch_with_legacy_numpy_module_name(tmp_path):
    """Original CIFAR files were pickled by Python 2 with ``numpy.core.multiarray`` globals."""
    raw = pickle.dumps(cifar_batch(2, 0), protocol=2)
    raw = raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"numpy.core.multiarray" in raw
    obj = data.restricted_unpickle(raw, "batch")
    assert obj[b"data"].shape == (2, 3072)


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_malicious_cifar_pickle_is_refused_not_executed(tmp_path, protocol):
    marker = tmp_path / "pwned"
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder, 2)
    evil = {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": _Evil(marker)}
    (folder / "test_batch").write_bytes(pickle.dumps(evil, protocol=protocol))
    with pytest.raises(DataError, match="refused") as exc:
        data.load("cifar10", root=tmp_path, split="test")
    assert_one_line(exc)
    assert not marker.exists()
    # the restricted unpickler refuses any other global too
    with pytest.raises(DataError):
        data.restricted_unpickle(pickle.dumps(Path("x")), "p")


def test_cifar_batch_bad_content(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder, 2)
    (folder / "test_batch").write_bytes(pickle.dumps([1, 2, 3], protocol=2))
    with pytest.raises(DataError, match="expected a dict"):
        data.load("cifar10", root=tmp_path, split="test")
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]}))
    with pytest.raises(DataError, match="3072"):
        data.load("cifar10", root=tmp_path, split="test")
    (folder / "test_batch").write_bytes(pickle.dumps(cifar_batch(2, 0))[:-20])
    with pytest.raises(DataError, match="truncated or corrupt") as exc:
        data.load("cifar10", root=tmp_path, split="test")
    assert "only plain data" not in str(exc.value)  # regression: a damaged file is not called unsafe
    b = cifar_batch(2, 0)
    b[b"labels"] = [3, 10]
    (folder / "test_batch").write_bytes(pickle.dumps(b))
    with pytest.raises(DataError, match=r"outside \[0, 10\)"):
        data.load("cifar10", root=tmp_path, split="test")


def test_cifar10_npz(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    y = rng.integers(0, 10, (4, 1)).astype(np.uint8)  # Keras stores N x 1 labels
    f = tmp_path / "cifar10.npz"
    np.savez(f, x_train=x, y_train=y, x_test=x[:2], y_test=y[:2])
    ds = data.load("cifar10", root=f, split="train")
    assert_contract(ds, 4, (3, 32, 32))
    np.testing.assert_allclose(ds.tensors[0].numpy(), x.transpose(0, 3, 1, 2) / 255.0, atol=1e-7)
    assert ds.tensors[1].tolist() == y[:, 0].tolist()
    assert_contract(data.load("cifar10", root=tmp_path, split="test"), 2, (3, 32, 32))


def test_cifar10_missing(tmp_path):
    with pytest.raises(DataError, match="cifar-10-batches-py") as exc:
        data.load("cifar10", root=tmp_path, split="train")
    assert_one_line(exc)


# ----------------------------------------------------------------------------------------- generic npz
@pytest.mark.parametrize("layout", ["nhw", "nhwc1", "nhwc3", "nchw1", "nchw3"])
@pytest.mark.parametrize("kind", ["uint8", "float"])
def test_generic_npz_layouts(tmp_path, layout, kind):
    rng = np.random.default_rng(0)
    c = 3 if layout.endswith("3") else 1
    base = rng.integers(0, 256, (5, c, 6, 6), dtype=np.uint8)  # N C H W
    arr = {"nhw": base[:, 0], "nhwc1": base.transpose(0, 2, 3, 1), "nhwc3": base.transpose(0, 2, 3, 1),
           "nchw1": base, "nchw3": base}[layout]
    if kind == "float":
        arr = arr.astype(np.float32) / 255.0
    y = np.array([0, 1, 2, 1, 0])
    f = tmp_path / "d.npz"
    np.savez(f, x=arr, y=y)
    ds = data.load("npz", root=f)
    assert_contract(ds, 5, (c, 6, 6))
    np.testing.assert_allclose(ds.tensors[0].numpy(), base / 255.0, atol=1e-6)
    assert ds.tensors[1].tolist() == y.tolist()


def test_generic_npz_split_keys_and_folder(tmp_path):
    x = np.zeros((4, 5, 5), np.uint8)
    np.savez(tmp_path / "only.npz", x_train=x, y_train=np.arange(4), x_test=x[:1], y_test=np.array([2]))
    assert len(data.load("npz", root=tmp_path, split="train")) == 4  # the one npz in the folder
    assert data.load("npz", root=tmp_path, split="test").tensors[1].tolist() == [2]
    np.savez(tmp_path / "second.npz", images=x, labels=np.arange(4))
    with pytest.raises(DataError, match="exactly one"):
        data.load("npz", root=tmp_path)
    assert len(data.load("npz", root=tmp_path / "second.npz")) == 4
    np.savez(tmp_path / "bad.npz", a=x)
    with pytest.raises(DataError, match="expected x/y"):
        data.load("npz", root=tmp_path / "bad.npz")


@pytest.mark.parametrize("case, pattern", [
    ("object", "Python objects|pickled"),
    ("2d", "N x H x W"),
    ("onehot", "one-hot"),
    ("float_range", r"float pixels lie in"),
    ("nan", "NaN"),
    ("count", "5 images but 4 labels"),
    ("negative", "negative label"),
    ("no_channel_axis", "1- or 3-channel"),
    ("float_labels", "integer class indices"),
    ("int_range", "expected 0-255"),
    ("bool", "not image data"),
    ("empty", "empty"),
])
def test_non_image_arrays_refused(tmp_path, case, pattern):
    x = np.zeros((5, 6, 6), np.uint8)
    y = np.arange(5)
    if case == "object":
        x = np.empty(5, dtype=object)
    elif case == "2d":
        x = np.zeros((5, 36), np.uint8)
    elif case == "onehot":
        y = np.eye(5)
    elif case == "float_range":
        x = np.full((5, 6, 6), 255.0, np.float32)
    elif case == "nan":
        x = np.full((5, 6, 6), np.nan, np.float32)
    elif case == "count":
        y = np.arange(4)
    elif case == "negative":
        y = np.array([0, 1, -1, 2, 3])
    elif case == "no_channel_axis":
        x = np.zeros((5, 4, 6, 6), np.uint8)
    elif case == "float_labels":
        y = np.array([0.5, 1, 2, 3, 4])
    elif case == "int_range":
        x = np.full((5, 6, 6), 1000, np.int32)
    elif case == "bool":
        x = np.zeros((5, 6, 6), bool)
    elif case == "empty":
        x, y = np.zeros((0, 6, 6), np.uint8), np.zeros(0, np.int64)
    f = tmp_path / "d.npz"
    np.savez(f, x=x, y=y, allow_pickle=True) if case == "object" else np.savez(f, x=x, y=y)
    with pytest.raises(DataError, match=pattern) as exc:
        data.load("npz", root=f)
    assert_one_line(exc)


def test_float_labels_that_are_integral_are_accepted():
    ds = data.arrays_to_dataset(np.zeros((2, 4, 4), np.float32), np.array([1.0, 3.0]), "t")
    assert ds.tensors[1].dtype == torch.int64 and ds.tensors[1].tolist() == [1, 3]


# ----------------------------------------------------------------------------------------- image folder
def write_png(path: Path, arr: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


def test_folder_grayscale(tmp_path):
    rng = np.random.default_rng(0)
    imgs = {}
    for cls in ("cat", "dog"):
        for i in range(3):
            a = rng.integers(0, 256, (6, 7), dtype=np.uint8)
            imgs[(cls, i)] = a
            write_png(tmp_path / cls / f"{i}.png", a)
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    before = listing(tmp_path)
    ds = data.load("folder", root=tmp_path)
    assert_contract(ds, 6, (1, 6, 7))
    assert ds.tensors[1].tolist() == [0, 0, 0, 1, 1, 1]  # classes in sorted order
    np.testing.assert_allclose(ds.tensors[0][3, 0].numpy(), imgs[("dog", 0)] / 255.0, atol=1e-7)
    assert listing(tmp_path) == before


def test_folder_rgb_with_split_subfolders(tmp_path):
    rng = np.random.default_rng(1)
    for split, n in (("train", 2), ("test", 1)):
        for cls in ("a", "b", "c"):
            for i in range(n):
                write_png(tmp_path / split / cls / f"{i}.png", rng.integers(0, 256, (5, 5, 3), dtype=np.uint8))
    tr = data.load("images", root=tmp_path, split="train")
    te = data.load("folder", root=tmp_path, split="test")
    assert_contract(tr, 6, (3, 5, 5))
    assert_contract(te, 3, (3, 5, 5))
    assert te.tensors[1].tolist() == [0, 1, 2]


def test_folder_limit_takes_a_seeded_class_stratified_subset(tmp_path):
    """--limit on a class-per-folder set: each class in proportion to its size, drawn with the seed (the first N
    files would all be the first class)."""
    for cls, n in (("a", 10), ("b", 10), ("c", 4)):
        for i in range(n):
            write_png(tmp_path / cls / f"{i:02d}.png", np.full((2, 2), 10 * i, np.uint8))
    ds = data.load("folder", root=tmp_path, limit=12)
    assert len(ds) == 12 and torch.bincount(ds.labels).tolist() == [5, 5, 2]
    again = data.load("folder", root=tmp_path, limit=12)
    assert again.files == ds.files  # seeded: the same subset every time
    other = data.load("folder", root=tmp_path, limit=12, seed=1)
    assert torch.bincount(other.labels).tolist() == [5, 5, 2] and other.files != ds.files
    assert ds.files == sorted(ds.files)  # folder order kept
    assert {f.name for f in ds.files if f.parent.name == "a"} != {f"{i:02d}.png" for i in range(5)}  # drawn
    small = data.load("folder", root=tmp_path, limit=2)
    assert len(small) == 2 and len(set(small.labels.tolist())) == 2
    assert len(data.load("folder", root=tmp_path, limit=100)) == 24
    with pytest.raises(DataError, match="seed must be an integer"):
        data.load("folder", root=tmp_path, limit=2, seed="x")


def test_limit_help_says_how_the_subset_is_chosen(capsys):
    from robustest.cli import main

    for verb in ("score", "eval", "train"):
        with pytest.raises(SystemExit):
            main([verb, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "the first N of the array formats" in text and "class-stratified subset" in text, verb


def test_stratified_subset_shares_and_remainders():
    from robustest.data.builtin import stratified_subset

    labels = [0] * 50 + [1] * 30 + [2] * 20
    for n in (1, 7, 10, 33, 99):
        keep = stratified_subset(labels, n, seed=3)
        assert len(keep) == n == len(set(keep)) and keep == sorted(keep)
        counts = np.bincount([labels[i] for i in keep], minlength=3)
        assert np.all(np.abs(counts - n * np.array([0.5, 0.3, 0.2])) < 1), (n, counts)
    assert stratified_subset(labels, 100) == list(range(100))
    assert stratified_subset(labels, 10, seed=0) == stratified_subset(labels, 10, seed=0)


def test_folder_errors(tmp_path):
    write_png(tmp_path / "a" / "0.png", np.zeros((5, 5), np.uint8))
    write_png(tmp_path / "b" / "0.png", np.zeros((6, 5), np.uint8))
    with pytest.raises(DataError, match="different sizes") as exc:
        data.load("folder", root=tmp_path)
    assert_one_line(exc)
    (tmp_path / "b" / "1.png").write_bytes(b"\x89PNG truncated")
    (tmp_path / "b" / "0.png").unlink()
    with pytest.raises(DataError, match="cannot decode"):
        data.load("folder", root=tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no class subfolders"):
        data.load("folder", root=empty)
    (empty / "cls").mkdir()
    with pytest.raises(DataError, match="no PNG/JPEG"):
        data.load("folder", root=empty)
    with pytest.raises(DataError, match="expected a folder"):
        data.load("folder", root=tmp_path / "a" / "0.png")


# ------------------------------------------------------------------------------------------ tests files
def test_save_and_load_tests_round_trip(tmp_path, tiny_images):
    x, y = tiny_images
    idx = torch.arange(12) * 3
    fol = torch.linspace(0, 1, 12)
    p = data.save_tests(tmp_path / "out" / "tests.pt", x, y, idx, "fol-fuzz", fol=fol,
                        extra={"eps": 0.3, "steps": torch.tensor([1, 2])})
    assert p.is_file() and listing(tmp_path) == ["out", "out/tests.pt"]  # no temp files left
    t = data.load_tests(p)
    assert torch.equal(t["x"], x) and torch.equal(t["y"], y) and torch.equal(t["x0_index"], idx)
    assert torch.equal(t["fol"], fol) and t["method"] == "fol-fuzz"
    assert t["extra"]["eps"] == 0.3 and t["extra"]["steps"].tolist() == [1, 2]
    torch.load(p, weights_only=True)  # plain data only
    ds = data.load("tests", root=p)
    assert_contract(ds, 12, (1, 8, 8))
    t2 = data.load_tests(data.save_tests(tmp_path / "t2.pt", x, y, idx, "m"))
    assert t2["fol"] is None and t2["extra"] == {}


def test_tests_file_errors(tmp_path, tiny_images):
    x, y = tiny_images
    with pytest.raises(DataError, match="shapes"):
        data.save_tests(tmp_path / "t.pt", x, y[:3], torch.arange(12), "m")
    assert not (tmp_path / "t.pt").exists()
    with pytest.raises(DataError, match="does not exist"):
        data.load_tests(tmp_path / "missing.pt")
    torch.save({"a": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(DataError, match="not a robustest tests file"):
        data.load_tests(tmp_path / "other.pt")
    torch.save(torch.nn.Linear(2, 2), tmp_path / "model.pt")
    with pytest.raises(DataError, match="not a robustest tests file") as exc:
        data.load_tests(tmp_path / "model.pt")
    assert_one_line(exc)
    (tmp_path / "rand.pt").write_bytes(os.urandom(300))
    with pytest.raises(DataError):
        data.load("tests", root=tmp_path / "rand.pt")


# ----------------------------------------------------------------------------------------- error paths
def test_missing_path_names_layouts(tmp_path):
    with pytest.raises(DataError, match="does not exist") as exc:
        data.load("mnist", root=tmp_path / "nope")
    msg = assert_one_line(exc)
    assert "nope" in msg and "mnist.npz" in msg and "train-images-idx3-ubyte" in msg


def test_empty_folder_names_files_and_layouts(tmp_path):
    with pytest.raises(DataError) as exc:
        data.load("mnist", root=tmp_path, split="train")
    msg = assert_one_line(exc)
    for part in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", ".gz", "raw/", "MNIST/raw/", "mnist.npz"):
        assert part in msg, part
    assert listing(tmp_path) == []


def test_missing_label_file_named(tmp_path):
    write_mnist_idx(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte") as exc:
        data.load("mnist", root=tmp_path, split="test")
    assert "t10k-images" not in str(exc.value)
    assert len(data.load("mnist", root=tmp_path, split="train")) == 7


def test_wrong_idx_magic(tmp_path):
    write_mnist_idx(tmp_path)
    p = tmp_path / "train-images-idx3-ubyte"
    raw = bytearray(p.read_bytes())
    raw[0:4] = b"\x12\x34\x08\x03"
    p.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="magic") as exc:
        data.load("mnist", root=tmp_path)
    assert_one_line(exc)
    p.write_bytes(idx_bytes(np.zeros((7,), np.uint8)))  # labels-shaped file where images belong
    with pytest.raises(DataError, match="dimensions"):
        data.load("mnist", root=tmp_path)


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_idx(tmp_path, gz):
    write_mnist_idx(tmp_path, gz=gz)
    name = "train-images-idx3-ubyte" + (".gz" if gz else "")
    p = tmp_path / name
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match="truncated") as exc:
        data.load("mnist", root=tmp_path)
    assert_one_line(exc)
    p.write_bytes(raw[:2])
    with pytest.raises(DataError, match="truncated|corrupt"):
        data.load("mnist", root=tmp_path)


def test_truncated_idx_header_and_trailing_bytes(tmp_path):
    write_mnist_idx(tmp_path)
    p = tmp_path / "train-labels-idx1-ubyte"
    raw = p.read_bytes()
    p.write_bytes(raw[:6])
    with pytest.raises(DataError, match="header"):
        data.load("mnist", root=tmp_path)
    p.write_bytes(raw + b"\x00")
    with pytest.raises(DataError, match="trailing"):
        data.load("mnist", root=tmp_path)


def test_gz_that_is_not_gzip(tmp_path):
    write_mnist_idx(tmp_path)
    p = tmp_path / "train-images-idx3-ubyte"
    p.rename(tmp_path / "train-images-idx3-ubyte.gz")
    with pytest.raises(DataError, match="corrupt") as exc:
        data.load("mnist", root=tmp_path)
    assert_one_line(exc)


def test_count_mismatch_idx(tmp_path):
    write_mnist_idx(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(6, np.uint8)))
    with pytest.raises(DataError, match="7 images but .* 6 labels") as exc:
        data.load("mnist", root=tmp_path)
    assert_one_line(exc)


def test_labels_outside_range_idx(tmp_path):
    write_mnist_idx(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.array([0, 1, 2, 3, 4, 5, 10], np.uint8)))
    with pytest.raises(DataError, match=r"label 10 outside \[0, 10\)") as exc:
        data.load("mnist", root=tmp_path)
    assert_one_line(exc)


def test_corrupt_npz(tmp_path):
    f = tmp_path / "mnist.npz"
    x, y = fake_mnist(3, 0)
    np.savez(f, x_train=x, y_train=y)
    raw = f.read_bytes()
    f.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match="truncated or corrupt") as exc:
        data.load("mnist", root=f)
    assert_one_line(exc)
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DataError, match="expected a folder of IDX files or a .npz"):
        data.load("mnist", root=tmp_path / "x.txt")


# -------------------------------------------------------------------------------------------- real MNIST
def test_real_mnist(mnist_root):
    tr = data.load("mnist", root=mnist_root, split="train")
    assert_contract(tr, 60000, (1, 28, 28))
    assert tr.tensors[1][:5].tolist() == [5, 0, 4, 1, 9]
    assert float(tr.tensors[0].max()) == 1.0
    te = data.load("mnist", root=mnist_root / "mnist.npz", split="test")
    assert_contract(te, 10000, (1, 28, 28))
    assert sorted(set(te.tensors[1].tolist())) == list(range(10))


def test_npz_labels_load_without_a_warning_and_are_writable(tmp_path) -> None:
    # regression: the bounded npz reader gives read-only arrays, and torch warned "The given NumPy array is not
    # writable" on the labels, a stray line before the CLI's one-line messages
    import warnings

    npz = tmp_path / "d.npz"
    np.savez(npz, x=np.zeros((6, 8, 8), dtype=np.uint8), y=np.arange(6, dtype=np.int64) % 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = data.load("npz", npz)
        x, y = ds.get_batch(slice(0, 6))
    assert torch.equal(y, torch.tensor([0, 1, 2, 0, 1, 2])) and x.shape == (6, 1, 8, 8)
    ds.labels[0] = 2  # a tensor of its own, not a view of the file's read-only buffer
    assert int(ds.labels[0]) == 2
