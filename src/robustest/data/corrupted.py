"""The published corrupted test sets, loaded as data sets (``corruption=``, ``severity=``).

* ``cifar10-c``, ``cifar100-c`` (Hendrycks & Dietterich 2019): ``root/<corruption>.npy`` holding the 5
  severities stacked (5 N x 32 x 32 x 3 uint8, severity 1 first) and ``root/labels.npy`` (5 N or N labels).
  Memory-mapped: only the selected severity's rows are read. ``robustest corrupt --format npy`` writes
  this layout, so our -C sets and the published ones are interchangeable.
* ``tinyimagenet-c``: the same ``.npy`` layout when ``root/<corruption>.npy`` exists, otherwise the
  published tree ``root/<corruption>/<severity>/<class>/*.JPEG``.
* ``mnist-c`` (Mu & Gilmer 2019): ``root/<corruption>/<split>_images.npy`` (N x 28 x 28 x 1 uint8) and
  ``<split>_labels.npy``; it has one severity, so ``severity`` must be left out.
* ``imagenet-c``: ``root/<corruption>/<severity>/<class>/*.JPEG`` (decoded lazily; ``resize``/``center_crop``).

The CIFAR and ImageNet sets are test sets: the ``split`` argument is ignored for them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from robustest.core.errors import DataError
from robustest.data.builtin import image_folder
from robustest.data.dataset import FolderDataset, ImageDataset, arrays_to_dataset
from robustest.data.formats import open_npy
from robustest.data.registry import DatasetInfo, LoadOptions, register

SEVERITIES = (1, 2, 3, 4, 5)


def _need_corruption(opts: LoadOptions, key: str, available: list[str]) -> str:
    if opts.corruption is None:
        raise DataError(f"{key} needs a corruption (--corruption NAME): available here: "
                        f"{', '.join(available) or 'none found'}")
    if opts.corruption not in available:
        raise DataError(f"{key} has no corruption {opts.corruption!r} in this folder: available: "
                        f"{', '.join(available) or 'none found'}")
    return opts.corruption


def _need_severity(opts: LoadOptions, key: str) -> int:
    s = opts.severity
    if s is None:
        raise DataError(f"{key} needs a severity (--severity 1-5)")
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s not in SEVERITIES:
        raise DataError(f"{key} severity must be an integer 1-5, got {s!r}")
    return int(s)


def _npy_names(root: Path) -> list[str]:
    return sorted(p.stem for p in root.glob("*.npy") if p.stem != "labels")


def _stacked_npy(root: Path, opts: LoadOptions, key: str, num_classes: int | None) -> ImageDataset:
    if not root.is_dir():
        raise DataError(f"{root}: {key} is a folder of <corruption>.npy files plus labels.npy")
    name = _need_corruption(opts, key, _npy_names(root))
    sev = _need_severity(opts, key)
    if not (root / "labels.npy").is_file():
        raise DataError(f"{root}: labels.npy is missing: the {key} layout holds <corruption>.npy and labels.npy")
    x = open_npy(root / f"{name}.npy")
    y = open_npy(root / "labels.npy", mmap=False)
    if x.ndim != 4 or x.shape[-1] not in (1, 3) or x.dtype != np.uint8:
        raise DataError(f"{root / (name + '.npy')}: expected uint8 images stacked as 5N x H x W x C, got "
                        f"{x.dtype} {x.shape}")
    if len(x) % len(SEVERITIES):
        raise DataError(f"{root / (name + '.npy')}: {len(x)} images do not split into 5 severities of equal size")
    n = len(x) // len(SEVERITIES)
    if len(y) == len(x):
        y = y[(sev - 1) * n: sev * n]
    elif len(y) != n:
        raise DataError(f"{root / 'labels.npy'}: {len(y)} labels for {n} images per severity (expected {n} or {5 * n})")
    rows = n if opts.limit is None else min(n, opts.limit)
    lo = (sev - 1) * n
    return arrays_to_dataset(x[lo: lo + rows], np.asarray(y[:rows]), f"{key} {name} severity {sev}",
                             opts.num_classes or num_classes)


def _tree(root: Path, opts: LoadOptions, key: str) -> FolderDataset:
    if not root.is_dir():
        raise DataError(f"{root}: {key} is a folder <corruption>/<severity>/<class>/*.JPEG")
    available = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    name = _need_corruption(opts, key, available)
    sev = _need_severity(opts, key)
    base = root / name / str(sev)
    if not base.is_dir():
        raise DataError(f"{root / name}: no severity folder {sev}/ (the layout is <corruption>/<severity>/<class>/)")
    return image_folder(base, opts, f"{key} {name} severity {sev}")


@register(DatasetInfo("cifar10-c", "CIFAR-10-C: <corruption>.npy (5 severities stacked) + labels.npy", True, 10,
                      (3, 32, 32), "a folder with <corruption>.npy files and labels.npy (the CIFAR-10-C layout)",
                      corrupted=True, aliases=("cifar-10-c",)))
def _load_cifar10c(root: Path | None, split: str, opts: LoadOptions) -> ImageDataset:
    assert root is not None
    return _stacked_npy(root, opts, "cifar10-c", 10)


@register(DatasetInfo("cifar100-c", "CIFAR-100-C: <corruption>.npy (5 severities stacked) + labels.npy", True, 100,
                      (3, 32, 32), "a folder with <corruption>.npy files and labels.npy (the CIFAR-100-C layout)",
                      corrupted=True, aliases=("cifar-100-c",)))
def _load_cifar100c(root: Path | None, split: str, opts: LoadOptions) -> ImageDataset:
    assert root is not None
    return _stacked_npy(root, opts, "cifar100-c", 100)


@register(DatasetInfo("tinyimagenet-c", "Tiny-ImageNet-C: <corruption>/<severity>/<class>/*.JPEG or the .npy layout",
                      True, 200, None, "a folder <corruption>/<severity>/<class>/*.JPEG (or <corruption>.npy + "
                      "labels.npy)", corrupted=True, aliases=("tiny-imagenet-c",)))
def _load_tinyc(root: Path | None, split: str, opts: LoadOptions) -> ImageDataset | FolderDataset:
    assert root is not None
    if root.is_dir() and (root / "labels.npy").is_file():
        return _stacked_npy(root, opts, "tinyimagenet-c", 200)
    return _tree(root, opts, "tinyimagenet-c")


@register(DatasetInfo("mnist-c", "MNIST-C: <corruption>/{train,test}_images.npy and _labels.npy", True, 10,
                      (1, 28, 28), "a folder <corruption>/test_images.npy, test_labels.npy (the MNIST-C layout)",
                      corrupted=True))
def _load_mnistc(root: Path | None, split: str, opts: LoadOptions) -> ImageDataset:
    assert root is not None
    if not root.is_dir():
        raise DataError(f"{root}: mnist-c is a folder <corruption>/{split}_images.npy, {split}_labels.npy")
    available = sorted(d.name for d in root.iterdir() if (d / f"{split}_images.npy").is_file())
    name = _need_corruption(opts, "mnist-c", available)
    if opts.severity is not None:
        raise DataError("mnist-c has a single severity per corruption: leave out --severity")
    folder = root / name
    if not (folder / f"{split}_labels.npy").is_file():
        raise DataError(f"{folder}: {split}_labels.npy is missing beside {split}_images.npy")
    x = open_npy(folder / f"{split}_images.npy", limit=opts.limit)
    y = open_npy(folder / f"{split}_labels.npy", mmap=False, limit=opts.limit)
    return arrays_to_dataset(x, y, f"mnist-c {name} {split}", opts.num_classes or 10)


@register(DatasetInfo("imagenet-c", "ImageNet-C: <corruption>/<severity>/<class>/*.JPEG, decoded lazily", True,
                      None, None, "a folder <corruption>/<severity>/<class>/*.JPEG (the ImageNet-C layout)",
                      corrupted=True))
def _load_imagenetc(root: Path | None, split: str, opts: LoadOptions) -> FolderDataset:
    assert root is not None
    return _tree(root, opts, "imagenet-c")
