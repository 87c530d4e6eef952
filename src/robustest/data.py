"""Data sets in the robustest contract: float32 images N x C x H x W in [0, 1] and int64 labels.

``load(name, root=None, split="train")`` returns a ``torch.utils.data.TensorDataset``. Nothing is ever
downloaded and nothing is written: every loader reads standard on-disk formats from ``root`` (the
argument, else the ``ROBUSTEST_DATA`` environment variable). The built-in default, ``digits``, is
scikit-learn's bundled 8x8 digits and needs no files.

Formats:

* ``digits``: scikit-learn's 1797 8x8 digits, rescaled to [0, 1]; a fixed stratified split (seed 0,
  20 % test: 1437 train / 360 test).
* ``mnist``, ``fashion-mnist``: a folder with the four IDX files (plain or ``.gz``; the original site's
  and torchvision's names, also under ``raw/`` or ``MNIST/raw``/``FashionMNIST/raw``), or a Keras-style npz
  (``x_train, y_train, x_test, y_test``) given as the file or found in the folder.
* ``cifar10``: the python batches folder ``cifar-10-batches-py`` (read with a restricted unpickler that
  accepts only plain containers, bytes and numpy arrays) or a Keras-style npz (N x 32 x 32 x 3).
* ``npz``: any npz with ``x``/``y`` (or ``x_<split>``/``y_<split>``, or ``images``/``labels``) arrays, NHW,
  NHWC or NCHW, uint8 (0-255) or float (already in [0, 1]).
* ``folder``: class-per-subfolder PNG/JPEG images (``root/<class>/*.png``, or ``root/<split>/<class>/...``).
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from robustest.errors import DataError

__all__ = ["DatasetInfo", "arrays_to_dataset", "info", "load", "names", "num_classes_of"]

SPLITS = ("train", "test")
_EXPECTED_LAYOUT = {  # what a missing path should have held, named in the error message
    "mnist": "a folder with train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
             "t10k-labels-idx1-ubyte (or train-images.idx3-ubyte names; plain or .gz; also under raw/ or "
             "MNIST/raw/) or a Keras-style mnist.npz",
    "fashion-mnist": "a folder with train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
                     "t10k-labels-idx1-ubyte (plain or .gz; also under raw/ or FashionMNIST/raw/) or a Keras-style "
                     "fashion-mnist.npz",
    "cifar10": "a folder with cifar-10-batches-py/data_batch_1..5 and test_batch, or a Keras-style cifar10.npz",
    "npz": "a .npz file with x/y (or x_train/y_train, x_test/y_test) arrays",
    "folder": "a folder with one subfolder of PNG/JPEG images per class",
    "tests": "a tests.pt file written by 'robustest generate'",
}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


@dataclass(frozen=True)
class DatasetInfo:
    """What the registry knows about a data set name."""

    name: str
    description: str
    needs_root: bool
    num_classes: int | None
    shape: tuple[int, int, int] | None  # C, H, W when fixed


_REGISTRY: dict[str, tuple[DatasetInfo, Callable[[Path | None, str], TensorDataset]]] = {}


def _register(info_: DatasetInfo):
    def deco(fn: Callable[[Path | None, str], TensorDataset]):
        _REGISTRY[info_.name] = (info_, fn)
        return fn

    return deco


def names() -> list[str]:
    """Names accepted by :func:`load`."""
    return sorted(_REGISTRY)


def info(name: str) -> DatasetInfo:
    """Registry entry of ``name`` (raises :class:`DataError` for an unknown name)."""
    key = _canonical(name)
    return _REGISTRY[key][0]


def num_classes_of(dataset: TensorDataset) -> int:
    """Number of classes of a loaded data set (max label + 1)."""
    y = dataset.tensors[1]
    return int(y.max()) + 1 if y.numel() else 0


def _canonical(name: str) -> str:
    key = name.lower().replace("_", "-")
    aliases = {"fashion": "fashion-mnist", "fmnist": "fashion-mnist", "cifar": "cifar10", "cifar-10": "cifar10",
               "images": "folder", "imagefolder": "folder"}
    key = aliases.get(key, key)
    if key not in _REGISTRY:
        raise DataError(f"unknown data set {name!r}: choose one of {', '.join(names())}")
    return key


def load(name: str, root: str | os.PathLike[str] | None = None, split: str = "train") -> TensorDataset:
    """Load data set ``name``'s ``split`` as a TensorDataset of (x float32 N x C x H x W in [0,1], y int64).

    ``root`` is a folder or file; when None, the ``ROBUSTEST_DATA`` environment variable is used.
    Raises :class:`DataError` (one-line message) for missing or malformed data.
    """
    key = _canonical(name)
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}: use 'train' or 'test'")
    info_, fn = _REGISTRY[key]
    if root is None and os.environ.get("ROBUSTEST_DATA"):
        root = os.environ["ROBUSTEST_DATA"]
    path = Path(root).expanduser() if root is not None else None
    if info_.needs_root:
        if path is None:
            raise DataError(f"data set {key!r} needs files: pass root=/--data-dir or set ROBUSTEST_DATA")
        if not path.exists():
            raise DataError(f"data path {str(path)!r} does not exist: pass the {key} data, i.e. "
                            f"{_EXPECTED_LAYOUT.get(key, info_.description)}")
    ds = fn(path, split)
    _validate(ds, key, info_.num_classes)
    return ds


def arrays_to_dataset(x: np.ndarray, y: np.ndarray, source: str, num_classes: int | None = None) -> TensorDataset:
    """Convert image and label arrays in any of the accepted layouts to a contract TensorDataset.

    ``x``: N x H x W, N x H x W x C or N x C x H x W (C in 1, 3), uint8 (0-255), another integer type
    with values in 0-255, or float already in [0, 1]. ``y``: N or N x 1 integer class indices.
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if x.dtype == object or y.dtype == object:
        raise DataError(f"{source}: arrays of Python objects are not image data")
    if x.ndim == 3:
        x = x[:, None, :, :]
    elif x.ndim == 4:
        if x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
            x = np.transpose(x, (0, 3, 1, 2))
        elif x.shape[1] in (1, 3):
            pass
        elif x.shape[-1] in (1, 3):
            x = np.transpose(x, (0, 3, 1, 2))
        else:
            raise DataError(f"{source}: images of shape {x.shape} have no 1- or 3-channel axis (NHW, NHWC or NCHW)")
    else:
        raise DataError(f"{source}: images must be N x H x W, N x H x W x C or N x C x H x W, got shape {x.shape}")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(f"{source}: labels must be a 1-D array of class indices, got shape {y.shape} (one-hot?)")
    if len(x) != len(y):
        raise DataError(f"{source}: {len(x)} images but {len(y)} labels")
    if not np.issubdtype(y.dtype, np.integer):
        if np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            raise DataError(f"{source}: labels have dtype {y.dtype}; they must be integer class indices")
    if x.dtype == np.uint8:
        xf = x.astype(np.float32) / 255.0
    elif np.issubdtype(x.dtype, np.integer):
        if x.size and (x.min() < 0 or x.max() > 255):
            raise DataError(f"{source}: integer pixels lie in [{x.min()}, {x.max()}], expected 0-255")
        xf = x.astype(np.float32) / 255.0
    elif np.issubdtype(x.dtype, np.floating):
        xf = x.astype(np.float32)
        if xf.size and not np.all(np.isfinite(xf)):
            raise DataError(f"{source}: images contain NaN or infinite values")
        if xf.size and (xf.min() < 0.0 or xf.max() > 1.0):
            raise DataError(
                f"{source}: float pixels lie in [{xf.min():.4g}, {xf.max():.4g}]; store uint8 or floats in [0, 1]"
            )
    else:
        raise DataError(f"{source}: images have dtype {x.dtype}, not image data (use uint8 or float)")
    yt = torch.from_numpy(np.ascontiguousarray(y.astype(np.int64)))
    if yt.numel() and int(yt.min()) < 0:
        raise DataError(f"{source}: negative label {int(yt.min())}; labels must lie in [0, K)")
    if num_classes is not None and yt.numel() and int(yt.max()) >= num_classes:
        raise DataError(f"{source}: label {int(yt.max())} outside [0, {num_classes})")
    return TensorDataset(torch.from_numpy(np.ascontiguousarray(xf)), yt)


def _validate(ds: TensorDataset, key: str, num_classes: int | None) -> None:
    x, y = ds.tensors[0], ds.tensors[1]
    assert x.dtype == torch.float32 and y.dtype == torch.int64 and x.dim() == 4
    if len(x) == 0:
        raise DataError(f"{key}: the data set is empty")
    if num_classes is not None and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise DataError(f"{key}: labels lie in [{int(y.min())}, {int(y.max())}], outside [0, {num_classes})")


# ------------------------------------------------------------------------------------------------ digits
@_register(DatasetInfo("digits", "scikit-learn's bundled 8x8 digits (built in, no files)", False, 10, (1, 8, 8)))
def _load_digits(root: Path | None, split: str) -> TensorDataset:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    idx = np.arange(len(y))
    tr, te = train_test_split(idx, test_size=0.2, stratify=y, random_state=0)
    sel = np.sort(tr if split == "train" else te)
    return TensorDataset(torch.from_numpy(x[sel][:, None]), torch.from_numpy(y[sel]))


# --------------------------------------------------------------------------------------------- IDX files
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
               0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def _read_maybe_gz(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except (EOFError, gzip.BadGzipFile, OSError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: cannot read ({type(exc).__name__}: {exc}); the file is truncated or corrupt") from exc


def read_idx(path: str | os.PathLike[str], expected_ndim: int | None = None) -> np.ndarray:
    """Read an IDX file (plain or .gz) into a NumPy array, checking magic number and length."""
    path = Path(path)
    raw = _read_maybe_gz(path)
    if len(raw) < 4:
        raise DataError(f"{path}: only {len(raw)} bytes, not an IDX file (truncated?)")
    zero, code, ndim = raw[0:2], raw[2], raw[3]
    if zero != b"\x00\x00" or code not in _IDX_DTYPES or ndim == 0:
        raise DataError(f"{path}: bad IDX magic number 0x{raw[:4].hex()}; not an IDX file")
    if expected_ndim is not None and ndim != expected_ndim:
        raise DataError(f"{path}: IDX file has {ndim} dimensions, expected {expected_ndim} (images 3, labels 1)")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_DTYPES[code])
    need = header + int(np.prod(dims)) * dtype.itemsize
    if len(raw) != need:
        what = "truncated" if len(raw) < need else "has trailing bytes"
        raise DataError(f"{path}: IDX file {what}: expected {need} bytes for shape {dims}, found {len(raw)}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


_MNIST_STEMS = {
    ("train", "images"): ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    ("train", "labels"): ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    ("test", "images"): ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    ("test", "labels"): ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}


def _find_idx(root: Path, split: str, kind: str, subdirs: tuple[str, ...]) -> tuple[Path | None, list[str]]:
    tried = []
    for sub in subdirs:
        base = root / sub if sub else root
        for stem in _MNIST_STEMS[(split, kind)]:
            for suffix in ("", ".gz"):
                cand = base / (stem + suffix)
                tried.append(str(Path(sub) / (stem + suffix)) if sub else stem + suffix)
                if cand.is_file():
                    return cand, tried
    return None, tried


def _load_keras_npz(path: Path, split: str, num_classes: int | None, source: str) -> TensorDataset:
    arrays = _open_npz(path)
    kx, ky = f"x_{split}", f"y_{split}"
    if kx not in arrays or ky not in arrays:
        raise DataError(f"{path}: npz has arrays {sorted(arrays)}, expected {kx} and {ky} (Keras-style)")
    return arrays_to_dataset(arrays[kx], arrays[ky], f"{source} {path.name}", num_classes)


def _open_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except ValueError as exc:  # object arrays refuse to load without pickle
        raise DataError(f"{path}: npz holds pickled objects, which are refused; store plain arrays") from exc
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a readable npz file ({exc}); the file is truncated or corrupt") from exc


def _mnist_like(root: Path, split: str, npz_names: tuple[str, ...], subdirs: tuple[str, ...],
                label: str) -> TensorDataset:
    if root.is_file():
        if root.suffix == ".npz":
            return _load_keras_npz(root, split, 10, label)
        raise DataError(f"{root}: expected a folder of IDX files or a .npz file for {label}")
    img, tried_i = _find_idx(root, split, "images", subdirs)
    lab, tried_l = _find_idx(root, split, "labels", subdirs)
    if img is not None and lab is not None:
        x = read_idx(img, 3)
        y = read_idx(lab, 1)
        if len(x) != len(y):
            raise DataError(f"{label}: {img.name} has {len(x)} images but {lab.name} has {len(y)} labels")
        return arrays_to_dataset(x, y, f"{label} {img.name}", 10)
    for name in npz_names:
        if (root / name).is_file():
            return _load_keras_npz(root / name, split, 10, label)
    missing = sorted({stem for kind, found in (("images", img), ("labels", lab)) if found is None
                      for stem in _MNIST_STEMS[(split, kind)]})
    raise DataError(
        f"no {label} {split} data in {root}: looked for IDX files {', '.join(missing)} (also .gz, in the folder and "
        f"under "
        f"{', '.join(s + '/' for s in subdirs if s)}) and npz {', '.join(npz_names)}"
    )


@_register(DatasetInfo("mnist", "MNIST from IDX files (plain/.gz) or Keras-style mnist.npz", True, 10, (1, 28, 28)))
def _load_mnist(root: Path | None, split: str) -> TensorDataset:
    assert root is not None
    return _mnist_like(root, split, ("mnist.npz",), ("", "raw", "MNIST/raw", "mnist"), "mnist")


@_register(DatasetInfo("fashion-mnist", "Fashion-MNIST from IDX files (plain/.gz) or a Keras-style npz", True, 10,
                       (1, 28, 28)))
def _load_fashion(root: Path | None, split: str) -> TensorDataset:
    assert root is not None
    return _mnist_like(root, split, ("fashion-mnist.npz", "fashion_mnist.npz", "fashion.npz"),
                       ("", "raw", "FashionMNIST/raw", "fashion-mnist", "fashion_mnist"), "fashion-mnist")


# ---------------------------------------------------------------------------------------------- CIFAR-10
class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler for CIFAR batches: only plain containers, bytes and numpy arrays can be built."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):  # noqa: D401
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused to load {module}.{name}")


def restricted_unpickle(raw: bytes, source: str) -> object:
    """Unpickle ``raw`` allowing only containers, bytes/str, numbers and numpy arrays."""
    try:
        return _RestrictedUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except pickle.UnpicklingError as exc:
        if not str(exc).startswith("refused to load"):  # a damaged stream, not a refused global
            raise DataError(f"{source}: not a readable pickle ({exc}); truncated or corrupt") from exc
        raise DataError(f"{source}: {exc}; only plain data (dicts, lists, bytes, numpy arrays) is accepted") from exc
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise DataError(f"{source}: not a readable pickle ({type(exc).__name__}); truncated or corrupt") from exc


def _cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    obj = restricted_unpickle(_read_maybe_gz(path), str(path))
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a dict with 'data' and 'labels', got {type(obj).__name__}")
    d = {(k.decode() if isinstance(k, bytes) else k): v for k, v in obj.items()}
    if "data" not in d or ("labels" not in d and "fine_labels" not in d):
        raise DataError(f"{path}: CIFAR batch lacks 'data'/'labels' (has {sorted(d)})")
    data = np.asarray(d["data"])
    labels = np.asarray(d.get("labels", d.get("fine_labels")))
    if data.ndim != 2 or data.shape[1] != 3072 or data.dtype != np.uint8:
        raise DataError(f"{path}: CIFAR 'data' must be uint8 N x 3072, got {data.dtype} {data.shape}")
    return data.reshape(-1, 3, 32, 32), labels


@_register(DatasetInfo("cifar10", "CIFAR-10 python batches folder or Keras-style npz (32x32x3)", True, 10,
                       (3, 32, 32)))
def _load_cifar10(root: Path | None, split: str) -> TensorDataset:
    assert root is not None
    if root.is_file():
        if root.suffix == ".npz":
            return _load_keras_npz(root, split, 10, "cifar10")
        raise DataError(f"{root}: expected the cifar-10-batches-py folder or a .npz file")
    files = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    for folder in (root / "cifar-10-batches-py", root):
        if all((folder / f).is_file() for f in files):
            parts = [_cifar_batch(folder / f) for f in files]
            x = np.concatenate([p[0] for p in parts])
            y = np.concatenate([p[1] for p in parts])
            return arrays_to_dataset(x, y, f"cifar10 {folder.name}", 10)
    for name in ("cifar10.npz", "cifar-10.npz"):
        if (root / name).is_file():
            return _load_keras_npz(root / name, split, 10, "cifar10")
    raise DataError(
        f"no cifar10 {split} data in {root}: looked for cifar-10-batches-py/{files[0]}"
        f"{'...data_batch_5' if split == 'train' else ''} and cifar10.npz"
    )


# ------------------------------------------------------------------------------------------ generic npz
@_register(DatasetInfo("npz", "any .npz with x/y (or x_<split>/y_<split>) arrays; NHW, NHWC or NCHW", True, None,
                       None))
def _load_npz(root: Path | None, split: str) -> TensorDataset:
    assert root is not None
    if root.is_dir():
        cands = sorted(root.glob("*.npz"))
        if len(cands) != 1:
            raise DataError(f"{root}: expected exactly one .npz file in the folder, found {len(cands)}; pass the file")
        root = cands[0]
    arrays = _open_npz(root)
    for kx, ky in ((f"x_{split}", f"y_{split}"), ("x", "y"), ("images", "labels"), ("X", "y")):
        if kx in arrays and ky in arrays:
            return arrays_to_dataset(arrays[kx], arrays[ky], f"npz {root.name}")
    raise DataError(f"{root}: npz has arrays {sorted(arrays)}; expected x/y or x_{split}/y_{split}")


# ------------------------------------------------------------------------------------------ image folder
@_register(DatasetInfo("folder", "class-per-subfolder PNG/JPEG images (root[/<split>]/<class>/*.png)", True, None,
                       None))
def _load_folder(root: Path | None, split: str) -> TensorDataset:
    assert root is not None
    from PIL import Image, UnidentifiedImageError

    if not root.is_dir():
        raise DataError(f"{root}: expected a folder with one subfolder per class")
    base = root / split if (root / split).is_dir() else root
    classes = sorted(d.name for d in base.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataError(f"{base}: no class subfolders found (expected <class>/<image>.png)")
    files: list[tuple[Path, int]] = []
    for label, cls in enumerate(classes):
        for f in sorted((base / cls).iterdir()):
            if f.suffix.lower() in IMAGE_SUFFIXES:
                files.append((f, label))
    if not files:
        raise DataError(f"{base}: class folders hold no PNG/JPEG images")
    images = []
    for f, _ in files:
        try:
            with Image.open(f) as im:
                im.load()
                images.append(im.copy())
        except (UnidentifiedImageError, OSError) as exc:
            raise DataError(f"{f}: cannot decode image ({exc}); the file is truncated or not an image") from exc
    gray = all(im.mode in ("L", "1", "I;16", "I") for im in images)
    mode = "L" if gray else "RGB"
    arrs = [np.asarray(im.convert(mode)) for im in images]
    shapes = {a.shape for a in arrs}
    if len(shapes) != 1:
        raise DataError(f"{base}: images have different sizes {sorted(shapes)[:3]}; resize them to one size first")
    x = np.stack(arrs)
    y = np.array([lab for _, lab in files], dtype=np.int64)
    return arrays_to_dataset(x, y, f"folder {base.name}")


# ------------------------------------------------------------------------------------------- tests files
TESTS_FORMAT = "robustest-tests"


def save_tests(path: str | os.PathLike[str], x: torch.Tensor, y: torch.Tensor, x0_index: torch.Tensor,
               method: str, fol: torch.Tensor | None = None, extra: dict | None = None) -> Path:
    """Atomically write generated tests: images ``x`` (N x C x H x W in [0,1]), labels ``y`` (int64 [N]),
    the index of each test's seed in its source data set ``x0_index`` (int64 [N]), the generating
    ``method``, optional FOL values ``fol`` (float [N]) and ``extra`` plain data (tensors or JSON-like).

    The file is a ``torch.save`` of plain data and loads with ``weights_only=True`` (:func:`load_tests`).
    """
    from robustest.runtime import atomic_save

    n = x.shape[0]
    if y.shape != (n,) or x0_index.shape != (n,) or (fol is not None and fol.shape != (n,)):
        raise DataError(f"tests file: x has {n} tests but y/x0_index/fol have shapes "
                        f"{tuple(y.shape)}/{tuple(x0_index.shape)}/{None if fol is None else tuple(fol.shape)}")
    payload = {
        "format": TESTS_FORMAT, "version": 1, "method": str(method),
        "x": x.detach().float().cpu(), "y": y.detach().long().cpu(), "x0_index": x0_index.detach().long().cpu(),
        "fol": None if fol is None else fol.detach().float().cpu(), "extra": dict(extra or {}),
    }
    return atomic_save(payload, path)


def load_tests(path: str | os.PathLike[str]) -> dict:
    """Read a tests file written by :func:`save_tests` (``torch.load(weights_only=True)``).

    Returns a dict with ``x``, ``y``, ``x0_index``, ``method``, ``fol`` (or None) and ``extra``.
    """
    from robustest.runtime import load_plain

    payload = load_plain(path, fmt=TESTS_FORMAT, what="robustest tests file",
                         fix="pass the tests.pt written by 'robustest generate'")
    x = payload["x"]
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise DataError(f"{path}: tests file holds no N x C x H x W image tensor")
    return payload


@_register(DatasetInfo("tests", "a tests file (tests.pt) written by 'robustest generate'", True, None, None))
def _load_tests_ds(root: Path | None, split: str) -> TensorDataset:
    assert root is not None
    t = load_tests(root)
    return TensorDataset(t["x"].float(), t["y"].long())
