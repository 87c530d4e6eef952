"""The data-set registry: each loader module registers its formats with :func:`register` on import;
:func:`load` checks the arguments, finds the data and validates what the loader returns."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from robustest.core.batching import labels_of
from robustest.core.errors import DataError
from robustest.core.options import option
from robustest.core.registry import Registry

SPLITS = ("train", "test")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


@dataclass(frozen=True)
class DatasetInfo:
    """What the registry knows about a data set name."""

    name: str
    description: str
    needs_root: bool
    num_classes: int | None
    shape: tuple[int, int, int] | None  # C, H, W when fixed
    layout: str = ""  # what a missing path should have held, named in the error message
    corrupted: bool = False  # takes corruption= / severity=
    aliases: tuple[str, ...] = ()  # other names it answers to


@dataclass(frozen=True)
class LoadOptions:
    """Options every loader receives (see :func:`load`); they carry the flags every verb that reads data offers."""

    limit: int | None = option(None, "positive-int", "use only N samples, chosen before decoding: the first N of the "
                               "array formats (MNIST, CIFAR, npz, npy), a seeded class-stratified subset of N images "
                               "of a class-per-folder set", metavar="N")
    seed: int = 0  # draws the class-stratified subset of an image folder under ``limit``
    num_classes: int | None = option(None, "positive-int", "labels must lie below K", metavar="K",
                                     shown="the data set's own, else below 100,000")
    corruption: str | None = option(None, "text", "corruption of a published -C set (cifar10-c, cifar100-c, mnist-c, "
                                    "imagenet-c, ...)", metavar="NAME")
    severity: int | None = option(None, "positive-int", "severity 1-5 of a -C set", metavar="S")
    resize: tuple[int, int] | None = option(None, "size", "resize image-folder images to H x W (for folders of mixed "
                                            "sizes)")
    center_crop: tuple[int, int] | None = option(None, "size", "then crop the centre H x W of each image")
    workers: int = option(0, "count", "DataLoader worker processes decoding images", metavar="N",
                          shown="0, in the main process")
    extra: dict[str, Any] = field(default_factory=dict)


Loader = Callable[[Path | None, str, LoadOptions], Dataset]


@dataclass(frozen=True)
class DatasetEntry:
    """A registered data set: what it is (:class:`DatasetInfo`) and its loader ``fn(root, split, options)``."""

    info: DatasetInfo
    loader: Loader


def _spelling(name: str) -> str:
    return str(name).lower().replace("_", "-")


#: every registered data set (the one registry shape of :class:`robustest.core.registry.Registry`)
DATASETS: Registry[DatasetEntry] = Registry("data set", canonical=_spelling, entry_type=DatasetEntry)


def register(info_: DatasetInfo, *, replace: bool = True) -> Callable[[Loader], Loader]:
    """Decorator adding a loader ``fn(root, split, options) -> Dataset`` under ``info_.name`` and its aliases
    (a second registration of a name replaces the first unless ``replace=False``)."""

    def deco(fn: Loader) -> Loader:
        DATASETS.register(info_.name, DatasetEntry(info_, fn), aliases=info_.aliases, replace=replace)
        return fn

    return deco


def unregister(name: str) -> DatasetEntry:
    """Remove data set ``name`` (and its aliases) and return its entry."""
    return DATASETS.unregister(canonical(name))


def names() -> list[str]:
    """Names accepted by :func:`load`."""
    return sorted(DATASETS.names())


def canonical(name: str) -> str:
    """The registry name for ``name`` (aliases resolved); :class:`DataError` for an unknown name."""
    if not isinstance(name, str):
        raise DataError(f"a data set name must be a string, got {type(name).__name__}")
    if name not in DATASETS:
        raise DataError(f"unknown data set {name!r}: choose one of {', '.join(names())}")
    return DATASETS.key(name)


def info(name: str) -> DatasetInfo:
    """Registry entry of ``name`` (raises :class:`DataError` for an unknown name)."""
    return DATASETS.get(canonical(name)).info


def num_classes_of(dataset: Any) -> int:
    """Number of classes of a loaded data set (max label + 1)."""
    y = labels_of(dataset)
    if y is None:
        raise DataError("the data set does not expose its labels: pass num_classes explicitly")
    return int(y.max()) + 1 if y.numel() else 0


def _positive(v: Any, what: str, allow_none: bool = True) -> int | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise DataError(f"{what} must be a positive integer, got {v!r}")
    return int(v)


def load(name: str, root: str | os.PathLike[str] | None = None, split: str = "train", *,
         limit: int | None = None, num_classes: int | None = None, corruption: str | None = None,
         severity: int | None = None, resize: tuple[int, int] | int | None = None,
         center_crop: tuple[int, int] | int | None = None, workers: int = 0, seed: int = 0) -> Dataset:
    """Load data set ``name``'s ``split``: a Dataset of (float32 C x H x W in [0, 1], int64 label) items.

    ``root`` is a folder or file; when None, the ``ROBUSTEST_DATA`` environment variable is used.
    ``limit`` keeps N samples, applied before decoding: the first N of the array formats, a class-stratified
    subset drawn with ``seed`` (each class in proportion to its size) of image folders; ``num_classes`` bounds
    the labels; ``corruption``/``severity`` select a published corrupted set; ``resize``/``center_crop``
    (H, W) and ``workers`` (decoding processes) apply to image folders. Raises :class:`DataError` (one-line message)
    for missing or malformed data.
    """
    from robustest.data.dataset import _pair

    key = canonical(name)
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}: use 'train' or 'test'")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise DataError(f"workers must be a non-negative integer, got {workers!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DataError(f"seed must be an integer, got {seed!r}")
    opts = LoadOptions(limit=_positive(limit, "limit"), seed=seed, num_classes=_positive(num_classes, "num_classes"),
                       corruption=corruption, severity=severity, resize=_pair(resize, "resize"),
                       center_crop=_pair(center_crop, "center crop"), workers=workers)
    entry = DATASETS.get(key)
    info_, fn = entry.info, entry.loader
    if not info_.corrupted and (corruption is not None or severity is not None):
        raise DataError(f"data set {key!r} has no corruptions: corruption/severity apply to "
                        f"{', '.join(n for n in names() if DATASETS.get(n).info.corrupted)}")
    if opts.num_classes is not None and opts.num_classes < 2:
        raise DataError(f"num_classes must be >= 2, got {opts.num_classes}")
    if root is not None and not info_.needs_root:
        raise DataError(f"data set {key!r} is built in and reads no files: drop root=/--data-dir {str(root)!r}")
    if root is None and os.environ.get("ROBUSTEST_DATA") and info_.needs_root:
        root = os.environ["ROBUSTEST_DATA"]
    path = Path(root).expanduser() if root is not None else None
    if info_.needs_root:
        if path is None:
            raise DataError(f"data set {key!r} needs files: pass root=/--data-dir or set ROBUSTEST_DATA")
        if not path.exists():
            raise DataError(f"data path {str(path)!r} does not exist: pass the {key} data, i.e. "
                            f"{info_.layout or info_.description}")
        if not (path.is_file() or path.is_dir()):  # a device (/dev/zero), a pipe or a socket never ends
            raise DataError(f"data path {str(path)!r} is neither a regular file nor a folder: pass the {key} data, "
                            f"i.e. {info_.layout or info_.description}")
    ds = fn(path, split, opts)
    if opts.limit is not None and len(ds) > opts.limit:  # loaders that could not apply it while reading
        ds = ds.head(opts.limit) if hasattr(ds, "head") else torch.utils.data.Subset(ds, range(opts.limit))
    _validate(ds, key, opts.num_classes or info_.num_classes)
    return ds


def _validate(ds: Dataset, key: str, num_classes: int | None) -> None:
    if len(ds) == 0:
        raise DataError(f"{key}: the data set is empty")
    y = labels_of(ds)
    if y is not None and num_classes is not None and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise DataError(f"{key}: labels lie in [{int(y.min())}, {int(y.max())}], outside [0, {num_classes})")
