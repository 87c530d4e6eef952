"""The standard formats: built-in digits, MNIST/Fashion-MNIST, CIFAR-10/100, npz/npy, image folders and
robustest tests files. Each loader registers itself in :mod:`robustest.data`."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from robustest.core.errors import DataError
from robustest.data.dataset import FolderDataset, ImageDataset, arrays_to_dataset, check_labels_array
from robustest.data.formats import (
    npz_names,
    open_npy,
    read_idx,
    read_maybe_gz,
    read_npz_images,
    restricted_unpickle,
)
from robustest.data.registry import IMAGE_SUFFIXES, DatasetInfo, LoadOptions, register

TESTS_FORMAT = "robustest-tests"


# ------------------------------------------------------------------------------------------------ digits
@register(DatasetInfo("digits", "scikit-learn's bundled 8x8 digits (built in, no files)", False, 10, (1, 8, 8)))
def _load_digits(root: Path | None, split: str, opts: LoadOptions) -> ImageDataset:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    idx = np.arange(len(y))
    tr, te = train_test_split(idx, test_size=0.2, stratify=y, random_state=0)
    sel = np.sort(tr if split == "train" else te)
    return ImageDataset(np.ascontiguousarray(x[sel][:, None]), torch.from_numpy(y[sel]), layout="NCHW",
                        source=f"digits {split}")


# ------------------------------------------------------------------------------------------ MNIST family
_MNIST_STEMS = {
    ("train", "images"): ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    ("train", "labels"): ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    ("test", "images"): ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    ("test", "labels"): ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}


def _find_idx(root: Path, split: str, kind: str, subdirs: tuple[str, ...]) -> Path | None:
    for sub in subdirs:
        base = root / sub if sub else root
        for stem in _MNIST_STEMS[(split, kind)]:
            for suffix in ("", ".gz"):
                cand = base / (stem + suffix)
                if cand.is_file():
                    return cand
    return None


def _not_npy(path: Path, what: str) -> None:
    if path.suffix == ".npy":
        raise DataError(f"{path}: is a single .npy array, not an npz archive of named arrays: pass {what}")


def load_keras_npz(path: Path, split: str, opts: LoadOptions, source: str, num_classes: int | None) -> ImageDataset:
    """A Keras-style npz (``x_<split>``, ``y_<split>``), reading only ``opts.limit`` rows."""
    kx, ky = f"x_{split}", f"y_{split}"
    have = npz_names(path)
    if kx not in have or ky not in have:
        raise DataError(f"{path}: npz has arrays {have}, expected {kx} and {ky} (Keras-style)")
    x, y = read_npz_images(path, kx, ky, limit=opts.limit, source=f"{source} {path.name}")
    return arrays_to_dataset(x, y, f"{source} {path.name}", opts.num_classes or num_classes)


def _mnist_like(root: Path, split: str, opts: LoadOptions, npz_names_: tuple[str, ...], subdirs: tuple[str, ...],
                label: str) -> ImageDataset:
    if root.is_file():
        if root.suffix == ".npz":
            return load_keras_npz(root, split, opts, label, 10)
        _not_npy(root, f"a Keras-style {label}.npz (x_train, y_train, x_test, y_test) or the IDX folder")
        raise DataError(f"{root}: expected a folder of IDX files or a .npz file for {label}")
    img = _find_idx(root, split, "images", subdirs)
    lab = _find_idx(root, split, "labels", subdirs)
    if img is not None and lab is not None:
        x = read_idx(img, 3, limit=opts.limit)
        y = read_idx(lab, 1, limit=opts.limit)
        if len(x) != len(y):
            raise DataError(f"{label}: {img.name} has {len(x)} images but {lab.name} has {len(y)} labels")
        return arrays_to_dataset(x, y, f"{label} {img.name}", 10)
    for name in npz_names_:
        if (root / name).is_file():
            return load_keras_npz(root / name, split, opts, label, 10)
    missing = sorted({stem for kind, found in (("images", img), ("labels", lab)) if found is None
                      for stem in _MNIST_STEMS[(split, kind)]})
    raise DataError(
        f"no {label} {split} data in {root}: looked for IDX files {', '.join(missing)} (also .gz, in the folder and "
        f"under {', '.join(s + '/' for s in subdirs if s)}) and npz {', '.join(npz_names_)}"
    )


_IDX_LAYOUT = ("a folder with train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
               "t10k-labels-idx1-ubyte (or train-images.idx3-ubyte names; plain or .gz; also under raw/) or a "
               "Keras-style {npz}")


@register(DatasetInfo("mnist", "MNIST from IDX files (plain/.gz) or Keras-style mnist.npz", True, 10, (1, 28, 28),
                      _IDX_LAYOUT.format(npz="mnist.npz")))
def _load_mnist(root: Path | None, split: str, opts: LoadOptions) -> ImageDataset:
    assert root is not None
    return _mnist_like(root, split, opts, ("mnist.npz",), ("", "raw", "MNIST/raw", "mnist"), "mnist")


@register(DatasetInfo("fashion-mnist", "Fashion-MNIST from IDX files (plain/.gz) or a Keras-style npz", True, 10,
                      (1, 28, 28), _IDX_LAYOUT.format(npz="fashion-mnist.npz"), aliases=("fashion", "fmnist")))
def _load_fashion(root: Path | None, split: str, opts: LoadOptions) -> ImageDataset:
    assert root is not None
    return _mnist_like(root, split, opts, ("fashion-mnist.npz", "fashion_mnist.npz", "fashion.npz"),
                       ("", "raw", "FashionMNIST/raw", "fashion-mnist", "fashion_mnist"), "fashion-mnist")


# ------------------------------------------------------------------------------------------------- CIFAR
_CIFAR_BATCH_BYTES = 256 * 2**20  # a real CIFAR batch pickle is about 30 MB


def _cifar_batch(path: Path, label_keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    obj = restricted_unpickle(read_maybe_gz(path, _CIFAR_BATCH_BYTES), str(path))
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a dict with 'data' and 'labels', got {type(obj).__name__}")
    d = {(k.decode() if isinstance(k, bytes) else k): v for k, v in obj.items()}
    key = next((k for k in label_keys if k in d), None)
    if "data" not in d or key is None:
        raise DataError(f"{path}: CIFAR batch lacks 'data'/{'/'.join(repr(k) for k in label_keys)} (has {sorted(d)})")
    data = np.asarray(d["data"])
    labels = np.asarray(d[key])
    if data.ndim != 2 or data.shape[1] != 3072 or data.dtype != np.uint8:
        raise DataError(f"{path}: CIFAR 'data' must be uint8 N x 3072, got {data.dtype} {data.shape}")
    return data.reshape(-1, 3, 32, 32), labels


def _cifar(root: Path, split: str, opts: LoadOptions, name: str, folder: str, files: list[str],
           label_keys: tuple[str, ...], num_classes: int) -> ImageDataset:
    if root.is_file():
        if root.suffix == ".npz":
            return load_keras_npz(root, split, opts, name, num_classes)
        _not_npy(root, f"a Keras-style {name}.npz (x_train, y_train, x_test, y_test) or the {folder} folder")
        raise DataError(f"{root}: expected the {folder} folder or a .npz file")
    for base in (root / folder, root):
        if all((base / f).is_file() for f in files):
            parts, total = [], 0
            for f in files:  # stop reading batches once --limit is reached
                parts.append(_cifar_batch(base / f, label_keys))
                total += len(parts[-1][0])
                if opts.limit is not None and total >= opts.limit:
                    break
            x = np.concatenate([p[0] for p in parts])[: opts.limit]
            y = np.concatenate([p[1] for p in parts])[: opts.limit]
            return arrays_to_dataset(x, y, f"{name} {base.name}", num_classes)
    for npz in (f"{name}.npz", f"{name.replace('cifar', 'cifar-')}.npz"):
        if (root / npz).is_file():
            return load_keras_npz(root / npz, split, opts, name, num_classes)
    raise DataError(f"no {name} {split} data in {root}: looked for {folder}/{files[0]}"
                    f"{'...' + files[-1] if len(files) > 1 else ''} and {name}.npz")


@register(DatasetInfo("cifar10", "CIFAR-10 python batches folder or Keras-style npz (32x32x3)", True, 10, (3, 32, 32),
                      "a folder with cifar-10-batches-py/data_batch_1..5 and test_batch, or a Keras-style cifar10.npz",
                      aliases=("cifar", "cifar-10")))
def _load_cifar10(root: Path | None, split: str, opts: LoadOptions) -> ImageDataset:
    assert root is not None
    files = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    return _cifar(root, split, opts, "cifar10", "cifar-10-batches-py", files, ("labels",), 10)


@register(DatasetInfo("cifar100", "CIFAR-100 python folder (fine labels) or Keras-style npz (32x32x3)", True, 100,
                      (3, 32, 32), "a folder with cifar-100-python/train and test, or a Keras-style cifar100.npz",
                      aliases=("cifar-100",)))
def _load_cifar100(root: Path | None, split: str, opts: LoadOptions) -> ImageDataset:
    assert root is not None
    return _cifar(root, split, opts, "cifar100", "cifar-100-python", [split], ("fine_labels",), 100)


# ---------------------------------------------------------------------------------------- npz and npy
@register(DatasetInfo("npz", "any .npz with x/y (or x_<split>/y_<split>) arrays; NHW, NHWC or NCHW", True, None,
                      None, "a .npz file with x/y (or x_train/y_train, x_test/y_test) arrays"))
def _load_npz(root: Path | None, split: str, opts: LoadOptions) -> ImageDataset:
    assert root is not None
    if root.is_dir():
        cands = sorted(root.glob("*.npz"))
        if len(cands) != 1:
            raise DataError(f"{root}: expected exactly one .npz file in the folder, found {len(cands)}; pass the file")
        root = cands[0]
    if root.suffix == ".npy":
        raise DataError(f"{root}: is a single .npy array, not an npz with x/y arrays: use --dataset npy with a folder "
                        "holding x.npy and y.npy, or save both arrays in one .npz")
    have = npz_names(root)
    for kx, ky in ((f"x_{split}", f"y_{split}"), ("x", "y"), ("images", "labels"), ("X", "y")):
        if kx in have and ky in have:
            x, y = read_npz_images(root, kx, ky, limit=opts.limit, source=f"npz {root.name}")
            return arrays_to_dataset(x, y, f"npz {root.name}", opts.num_classes)
    raise DataError(f"{root}: npz has arrays {have}; expected x/y or x_{split}/y_{split}")


@register(DatasetInfo("npy", "a folder of .npy arrays (x.npy/y.npy or <split>_images.npy/<split>_labels.npy), "
                      "memory-mapped", True, None, None,
                      "a folder with x.npy and y.npy (or train_images.npy/train_labels.npy, test_...)"))
def _load_npy(root: Path | None, split: str, opts: LoadOptions) -> ImageDataset:
    assert root is not None
    if root.is_file():
        raise DataError(f"{root}: --dataset npy takes a folder holding x.npy and y.npy (or "
                        f"{split}_images.npy and {split}_labels.npy)")
    for kx, ky in ((f"x_{split}.npy", f"y_{split}.npy"), (f"{split}_images.npy", f"{split}_labels.npy"),
                   ("x.npy", "y.npy")):
        if (root / kx).is_file() and (root / ky).is_file():
            x = open_npy(root / kx, limit=opts.limit)
            y = open_npy(root / ky, mmap=False, limit=opts.limit)
            return arrays_to_dataset(x, y, f"npy {root.name}/{kx}", opts.num_classes)
    raise DataError(f"{root}: no x.npy/y.npy (or {split}_images.npy/{split}_labels.npy) in the folder")


# ------------------------------------------------------------------------------------------ image folder
def stratified_subset(labels: list[int], n: int, seed: int = 0) -> list[int]:
    """Indices (ascending) of a seeded, class-stratified subset of ``n`` of the items labelled ``labels``.

    Each class gets its share of ``n`` in proportion to its size (rounded down; the items left over go to the
    classes with the largest remainders, ties broken by the seed), drawn at random within the class. The same
    ``labels``, ``n`` and ``seed`` give the same subset; every class is represented when ``n`` is at least the
    number of classes and the classes are of similar size."""
    total = len(labels)
    if n >= total:
        return list(range(total))
    by_class: dict[int, list[int]] = {}
    for i, c in enumerate(labels):
        by_class.setdefault(int(c), []).append(i)
    classes = sorted(by_class)
    g = torch.Generator().manual_seed(int(seed))
    exact = {c: n * len(by_class[c]) / total for c in classes}
    quota = {c: int(exact[c]) for c in classes}
    tie = torch.randperm(len(classes), generator=g).tolist()
    order = sorted(range(len(classes)), key=lambda k: (-(exact[classes[k]] - quota[classes[k]]), tie[k]))
    left = n - sum(quota.values())
    for k in order:
        if left == 0:
            break
        c = classes[k]
        if quota[c] < len(by_class[c]):
            quota[c] += 1
            left -= 1
    keep: list[int] = []
    for c in classes:
        members = by_class[c]
        pick = torch.randperm(len(members), generator=g)[: quota[c]].tolist()
        keep += [members[j] for j in pick]
    return sorted(keep)


def image_folder(base: Path, opts: LoadOptions, source: str) -> FolderDataset:
    """A :class:`FolderDataset` over ``base/<class>/*`` (classes sorted by name, files sorted within)."""
    if not base.is_dir():
        raise DataError(f"{base}: expected a folder with one subfolder per class")
    classes = sorted(d.name for d in base.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataError(f"{base}: no class subfolders found (expected <class>/<image>.png)")
    if opts.num_classes is not None and len(classes) > opts.num_classes:
        raise DataError(f"{base}: {len(classes)} class folders but num_classes is {opts.num_classes}")
    files: list[Path] = []
    labels: list[int] = []
    for label, cls in enumerate(classes):
        with os.scandir(base / cls) as it:
            names = sorted(e.name for e in it if e.is_file() and os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES)
        files += [base / cls / n for n in names]
        labels += [label] * len(names)
    if not files:
        raise DataError(f"{base}: class folders hold no PNG/JPEG images")
    if opts.limit is not None and opts.limit < len(files):  # listing is cheap: only the subset is decoded
        keep = stratified_subset(labels, opts.limit, opts.seed)
        files, labels = [files[i] for i in keep], [labels[i] for i in keep]
    return FolderDataset(files, labels, classes, resize=opts.resize, center_crop=opts.center_crop,
                         num_workers=opts.workers, source=source)


@register(DatasetInfo("folder", "class-per-subfolder PNG/JPEG images (root[/<split>]/<class>/*.png), decoded lazily",
                      True, None, None, "a folder with one subfolder of PNG/JPEG images per class",
                      aliases=("images", "imagefolder")))
def _load_folder(root: Path | None, split: str, opts: LoadOptions) -> FolderDataset:
    assert root is not None
    if not root.is_dir():
        raise DataError(f"{root}: expected a folder with one subfolder per class")
    base = root / split if (root / split).is_dir() else root
    return image_folder(base, opts, f"folder {base.name}")


# ------------------------------------------------------------------------------------------- tests files
def save_tests(path: str | os.PathLike[str], x: torch.Tensor, y: torch.Tensor, x0_index: torch.Tensor,
               method: str, fol: torch.Tensor | None = None, extra: dict | None = None) -> Path:
    """Atomically write generated tests: images ``x`` (N x C x H x W in [0,1]), labels ``y`` (int64 [N]),
    the index of each test's seed in its source data set ``x0_index`` (int64 [N]), the generating
    ``method``, optional FOL values ``fol`` (float [N]) and ``extra`` plain data (tensors or JSON-like).

    The file is a ``torch.save`` of plain data and loads with ``weights_only=True`` (:func:`load_tests`).
    """
    from robustest.core.atomic import atomic_save

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
    """Read and validate a tests file written by :func:`save_tests` (``torch.load(weights_only=True)``).

    Returns a dict with ``x`` (float N x C x H x W in [0, 1]), ``y`` (int64 [N]), ``x0_index`` (int64 [N],
    non-negative), ``method``, ``fol`` (float [N] or None) and ``extra``. Any missing key, wrong dtype or
    length, or value out of range is a :class:`DataError` naming it.
    """
    from robustest.core.inputs import check_images
    from robustest.core.reading import load_plain

    payload = load_plain(path, fmt=TESTS_FORMAT, what="robustest tests file",
                         fix="pass the tests.pt written by 'robustest generate'")
    bad = f"{path}: damaged tests file:"
    x = payload.get("x")
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
        raise DataError(f"{bad} no N x C x H x W float image tensor 'x'; regenerate it with 'robustest generate'")
    check_images(x, f"{path} x")
    n = x.shape[0]
    for key, required in (("y", True), ("x0_index", True), ("fol", False)):
        t = payload.get(key)
        if t is None and not required:
            continue
        if not isinstance(t, torch.Tensor) or t.shape != (n,):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise DataError(f"{bad} {key!r} must be a tensor of shape [{n}] (one per test), got {got}")
        if key != "fol" and (t.is_floating_point() or t.dtype == torch.bool):
            raise DataError(f"{bad} {key!r} must hold integers, got {t.dtype}")
        if key == "fol" and (not t.is_floating_point() or not bool(torch.isfinite(t).all())):
            raise DataError(f"{bad} 'fol' must hold finite floats")
    if n:
        check_labels_array(payload["y"].numpy(), f"{path} y")
        if int(payload["x0_index"].min()) < 0:
            raise DataError(f"{bad} negative seed index in 'x0_index'")
    payload.setdefault("method", "unknown")
    payload["extra"] = payload.get("extra") if isinstance(payload.get("extra"), dict) else {}
    return payload


@register(DatasetInfo("tests", "a tests file (tests.pt) written by 'robustest generate'", True, None, None,
                      "a tests.pt file written by 'robustest generate'"))
def _load_tests_ds(root: Path | None, split: str, opts: LoadOptions) -> ImageDataset:
    assert root is not None
    t = load_tests(root)
    x, y = t["x"].float(), t["y"].long()
    if opts.limit is not None:
        x, y = x[: opts.limit], y[: opts.limit]
    return ImageDataset(x.contiguous(), y, layout="NCHW", source=f"tests {Path(root).name}")
